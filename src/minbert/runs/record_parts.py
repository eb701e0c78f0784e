"""The parts a run's record is made of, typed (``minbert.runs.training`` holds the
runs): the checkpoint, the data split, the settings as recorded, the head warm-up, SMART's
terms, the MLM start and scores, and how a stage ran on a GPU node. Each is read from
and written to the record's JSON form. Torch-free."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields

from minbert.settings import HeadWarmup, MlmSettings, MultitaskSettings, RunStart, SmartSettings

# The multitask settings a record states apart from its `settings` (per task, or beside them;
# cuda_graphs in step_execution, with what the steps ran from).
STATED_APART = (
    *("batch_size", "train_examples", "validation_examples", "history_examples", "seed"),
    *("batches_per_step", "cuda_graphs"),
)


@dataclass(frozen=True)
class RecordedSettings:
    """A multitask run's ``settings`` as its record states them: ``MultitaskSettings`` less
    what the record states apart (``STATED_APART``)."""

    paraphrase_head: str
    sts_head: str
    gradient: str
    optimizer: str
    lr: float
    weight_decay: float
    lr_schedule: str
    lr_gamma: float
    epochs: int
    eval_batch_size: int
    dropout: float
    grad_clip: float
    smart: SmartSettings | None
    max_tokens: int
    compile: bool
    pooling: str
    sts_output: str
    test_predictions: bool
    head_lr: float | None
    carved_quora_batch: str
    head_warmup: HeadWarmup

    @classmethod
    def from_dict(cls, values: dict) -> RecordedSettings:
        smart, warmup = values.get("smart"), values.get("head_warmup") or {}
        return cls(
            **{k: v for k, v in values.items() if k not in ("smart", "head_warmup")},
            smart=None if smart is None else SmartSettings(**smart),
            head_warmup=HeadWarmup.from_dict(warmup),
        )

    @classmethod
    def of(cls, settings: MultitaskSettings) -> RecordedSettings:
        """A run's settings less what its record states apart."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def as_dict(self) -> dict:
        """The record's form, as JSON reads it back (the order it was written in)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


assert [f.name for f in fields(RecordedSettings)] == [
    f.name for f in fields(MultitaskSettings) if f.name not in STATED_APART
], "RecordedSettings must follow MultitaskSettings"


@dataclass(frozen=True)
class ZeroShotRecordedSettings:
    """The untrained checkpoint's row's ``settings``: what its resolved settings file gives
    besides what its record states apart (checkpoint, pooling, scale, seed): the training
    pairs Quora's threshold is chosen on, the scoring batch, and SST's probe (the start
    every configuration fits, ``RunStart``), whose seed is the record's."""

    quora_train_pairs: int
    eval_batch_size: int
    sst_probe: RunStart

    @classmethod
    def of(cls, resolved: dict) -> ZeroShotRecordedSettings:
        """From the zero-shot stage's resolved settings file."""
        probe = RunStart.from_dict(resolved["sst_probe"])
        return cls(resolved["quora_train_pairs"], resolved["eval_batch_size"], probe)

    @classmethod
    def from_dict(cls, values: dict, seed: int) -> ZeroShotRecordedSettings:
        """Back from the record's form, the record's ``seed`` the probe's."""
        probe = RunStart.from_dict({**values["sst_probe"], "seed": seed})
        return cls(values["quora_train_pairs"], values["eval_batch_size"], probe)

    def as_dict(self) -> dict:
        """The record's form: the probe without its seed, which the record states apart."""
        values = json.loads(json.dumps(dataclasses.asdict(self)))
        del values["sst_probe"]["seed"]
        return values


def schedule_words(name: str, gamma: float | None, epochs: int | None = None) -> str:
    """A schedule as a table states it; a per-epoch decay a one-epoch run never applies says so."""
    step = ", a fraction every step" if name == "exponential-per-step" else ""
    never = " (never applied: one epoch)" if name == "exponential" and epochs == 1 else ""
    return "constant" if name == "constant" else f"× {gamma:g} per epoch{step}{never}"


@dataclass(frozen=True)
class CourseOverlap:
    """A dataset a checkpoint was trained on that a course task's data also comes from."""

    task: str
    dataset: str
    examples: int


@dataclass(frozen=True)
class TrainingData:
    """What a checkpoint's card says it was trained on (``describe_checkpoint``)."""

    file: str
    datasets: int
    examples: int
    course_overlap: list[CourseOverlap]

    @classmethod
    def from_dict(cls, values: dict) -> TrainingData:
        return cls(**{**values, "course_overlap": [CourseOverlap(**o) for o in values["course_overlap"]]})


@dataclass(frozen=True)
class Checkpoint:
    name: str
    weights: str
    sha256: str
    training_data: TrainingData | None  # None: the checkpoint has no card of its data

    @classmethod
    def from_dict(cls, values: dict) -> Checkpoint:
        data = values.get("training_data")
        return cls(**{**values, "training_data": None if data is None else TrainingData.from_dict(data)})


@dataclass(frozen=True)
class QuoraSplit:
    """Where the Quora pairs came from (the data stage's manifest): the official split, or
    train and dev carved from the course's labelled dev file."""

    kind: str
    note: str | None
    heldout_pairs: int | None
    values: dict  # the whole, as the manifest states it (and the record writes it back)

    @property
    def carved(self) -> bool:
        return self.kind == "carved-from-dev"


@dataclass(frozen=True)
class DataSplit:
    """Which data a multitask run's numbers come from, per task."""

    sst: str
    sts: str
    quora: QuoraSplit

    @classmethod
    def from_dict(cls, values: dict) -> DataSplit:
        quora = values["quora"]
        if isinstance(quora, str):
            quora = {"kind": quora}
        split = QuoraSplit(quora["kind"], quora.get("note"), quora.get("heldout_pairs"), quora)
        return cls(values["sst"], values["sts"], split)


@dataclass(frozen=True)
class StepExecution:
    """How a multitask run's steps ran: ``cuda_graphs`` (its setting), ``graphs`` (whether
    they were replayed from CUDA graphs) and why (``minbert.train.step_execution``)."""

    cuda_graphs: bool
    graphs: bool
    why: str


@dataclass(frozen=True)
class OfflineRun:
    """How a stage ran on a GPU node (``minbert.offline.runner``)."""

    device: str
    values: dict  # the whole, as the node wrote it (and the record writes it back)

    @classmethod
    def from_dict(cls, values: dict) -> OfflineRun:
        return cls(values["device"], values)


@dataclass(frozen=True)
class WarmupKept:
    """A task's head warm-up in a run (``minbert.train.head_warmup``)."""

    rows: int
    epochs_kept: int
    validation_loss_before: float
    validation_loss_after: float


@dataclass(frozen=True)
class AppliedRate:
    """The encoder's learning rate at an epoch's first and last optimizer step, as applied:
    what shows a schedule acted within the run."""

    epoch: int
    first_step: float
    last_step: float


@dataclass(frozen=True)
class Pretraining:
    """The MLM stage a multitask run started from."""

    start: str
    directory: str


@dataclass(frozen=True)
class SmartTerms:
    """SMART's last-epoch terms per task: R_s as trained, and its control."""

    adversarial: dict[str, float]
    adversarial_control: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class MaskedScores:
    """Masked-token scores on the held-out sequences (before: the start; after: trained)."""

    masked_accuracy: float | None = None  # after: the metrics file's accuracy
    perplexity: float
    loss: float
    masked_tokens: int


@dataclass(frozen=True)
class MlmCorpus:
    train_sequences: int
    heldout_sequences: int
    train_tokens: int
    sources: dict[str, int]
    text: str


def record_form(value: object) -> object:
    """A typed part in the form its record states it (JSON's types, the fields' order): an
    optional field (one whose default is None) is left out while None, as the stages
    leave it out; the settings keep every field, as ``asdict`` gives them."""
    if isinstance(value, (QuoraSplit, OfflineRun)):
        return value.values
    if isinstance(value, (RecordedSettings, ZeroShotRecordedSettings)):
        return value.as_dict()
    if isinstance(value, MlmSettings):  # its seed is stated beside it
        return {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(value))).items() if k != "seed"}
    if dataclasses.is_dataclass(value):
        return {
            f.name: record_form(getattr(value, f.name))
            for f in fields(value)
            if not (f.default is None and getattr(value, f.name) is None)
        }
    if isinstance(value, dict):
        return {k: record_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [record_form(v) for v in value]
    return value
