"""The stages' run files, typed for their readers: a multitask, sentiment, zero-shot
or MLM run is its metrics file joined with its record (``minbert.results``), read here
once into a frozen dataclass whose fields are the record's keys. The report reads runs
only through these; a file that lacks a key, or holds one this version does not know,
is named in one line (written by another version of its stage: rerun it), never a
KeyError deep in a page. Torch-free."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

from minbert.results import is_record, read_result
from minbert.settings import HeadWarmup, MlmSettings, MultitaskSettings, SmartSettings
from minbert.tasks import AVERAGE, MULTITASK_TASKS

# The multitask settings a record states apart from its `settings` (per task, or beside them).
STATED_APART = ("batch_size", "train_examples", "validation_examples", "history_examples", "seed")


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
            head_warmup=HeadWarmup(**{k: tuple(v) if k == "tasks" else v for k, v in warmup.items()}),
        )

    def as_dict(self) -> dict:
        """The record's form, as JSON reads it back (the order it was written in)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


assert [f.name for f in fields(RecordedSettings)] == [
    f.name for f in fields(MultitaskSettings) if f.name not in STATED_APART
], "RecordedSettings must follow MultitaskSettings"


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
    weights: str | None = None
    sha256: str | None = None
    training_data: TrainingData | None = None

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
    values: dict  # the rest, as the manifest states it

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
class OfflineRun:
    """How a stage ran on a GPU node (``minbert.offline.runner``)."""

    device: str
    values: dict  # the rest, as the node wrote it

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
class Pretraining:
    """The MLM stage a multitask run started from."""

    start: str
    directory: str


@dataclass(frozen=True)
class SmartTerms:
    """SMART's last-epoch terms per task: R_s as trained, and its control."""

    adversarial: dict[str, float]
    adversarial_control: dict[str, float]


@dataclass(frozen=True)
class MultitaskRunFile:
    """``metrics/multitask/<config>.json`` with ``<config>-run.json``."""

    config: str
    scores: dict[str, float]  # each task's dev metric and AVERAGE, at the kept epoch
    epoch: int  # the kept epoch (0: the start)
    steps: int  # optimizer steps over all epochs
    epochs: int
    selection: str
    dev_selection: dict[str, float]
    start_dev: dict[str, float]
    examples_seen: dict[str, int]
    train_examples: dict[str, int]
    validation_examples: dict[str, int]
    head_warmup: dict[str, WarmupKept]
    dev_examples: dict[str, int]
    history_examples: dict[str, dict[str, int]]
    data_split: DataSplit
    settings: RecordedSettings
    batch_size: dict[str, int]
    processes: int
    checkpoint: Checkpoint
    pretraining: Pretraining | None
    scale: str
    seed: int
    device: str
    smart: SmartTerms | None = None
    pcgrad_conflict_fraction: float | None = None
    offline_run: OfflineRun | None = None

    @property
    def name(self) -> str:
        return self.config

    def settings_dict(self) -> dict:
        """Every setting the run ran at, the ones stated apart included (record form)."""
        return {**self.settings.as_dict(), **{k: getattr(self, k) for k in STATED_APART}}


@dataclass(frozen=True)
class SentimentRunFile:
    """``metrics/sentiment/<run>.json`` with ``<run>-run.json``."""

    run: str
    task: str
    mode: str
    accuracy: float
    epoch: int
    steps: int
    epochs: int
    epochs_run: int
    train_accuracy: float
    selection: str
    dev_mcc: float
    examples_seen: int
    lr: float
    head_lr: float | None
    batch_size: int
    optimizer: str
    pooling: str
    train_examples: int
    validation_examples: int
    dev_examples: int
    data_split: str
    checkpoint: Checkpoint
    scale: str
    seed: int
    device: str
    offline_run: OfflineRun | None = None

    @property
    def name(self) -> str:
        return self.run


@dataclass(frozen=True)
class ZeroShotRunFile:
    """``metrics/zero-shot.json`` with its record: the untrained checkpoint on dev."""

    config: str
    scores: dict[str, float]
    dev_examples: dict[str, int]
    method: dict[str, str]
    sst_majority_class: int
    pooling: str
    data_split: DataSplit
    checkpoint: Checkpoint
    scale: str
    seed: int
    device: str
    offline_run: OfflineRun | None = None


@dataclass(frozen=True)
class MaskedScores:
    """Masked-token scores on the held-out sequences (before: the start; after: trained)."""

    perplexity: float
    loss: float
    masked_tokens: int
    masked_accuracy: float | None = None  # after: the metrics file's accuracy


@dataclass(frozen=True)
class MlmCorpus:
    train_sequences: int
    heldout_sequences: int
    train_tokens: int
    sources: dict[str, int]
    text: str


@dataclass(frozen=True)
class MlmRunFile:
    """``metrics/mlm/<start>.json`` with its record: one MLM pretraining run."""

    start: str
    accuracy: float
    steps: int
    base_checkpoint: Checkpoint
    head: str
    model: dict | None
    before: MaskedScores
    after: MaskedScores
    corpus: MlmCorpus
    settings: MlmSettings
    scale: str
    seed: int
    device: str
    offline_run: OfflineRun | None = None


Run = TypeVar("Run", MultitaskRunFile, SentimentRunFile, ZeroShotRunFile, MlmRunFile)
_SCORE_KEYS = (*MULTITASK_TASKS, AVERAGE)


def _typed(kind: type[Run], path: Path, values: dict) -> Run:
    """``values`` (a run's joined files) as ``kind``, or one line naming what does not fit."""
    known = {f.name for f in fields(kind)}
    missing_scores = []
    if "scores" in known:  # the metrics file's task scores, gathered under one field
        missing_scores = [k for k in _SCORE_KEYS if k not in values]
        scores = {k: values[k] for k in _SCORE_KEYS if k in values}
        values = {k: v for k, v in values.items() if k not in _SCORE_KEYS} | {"scores": scores}
    required = {f.name for f in fields(kind) if f.default is dataclasses.MISSING}
    missing = sorted(required - values.keys()) + missing_scores
    unknown = sorted(values.keys() - known)
    if missing or unknown:
        said = [
            f"missing {', '.join(missing)}" if missing else "",
            f"unknown {', '.join(unknown)}" if unknown else "",
        ]
        raise ValueError(
            f"{path}: {'; '.join(s for s in said if s)}: written by another version of its stage; "
            "rerun it (dvc repro)"
        )
    converters = {
        "checkpoint": Checkpoint.from_dict,
        "base_checkpoint": Checkpoint.from_dict,
        "offline_run": OfflineRun.from_dict,
        "smart": lambda v: SmartTerms(**v),
        "pretraining": lambda v: Pretraining(**v),
        "head_warmup": lambda v: {t: WarmupKept(**w) for t, w in v.items()},
        "before": lambda v: MaskedScores(**v),
        "after": lambda v: MaskedScores(**v),
        "corpus": lambda v: MlmCorpus(**v),
    }
    typed = {k: converters[k](v) if k in converters and v is not None else v for k, v in values.items()}
    if kind in (MultitaskRunFile, ZeroShotRunFile):
        typed["data_split"] = DataSplit.from_dict(values["data_split"])
    if kind is MultitaskRunFile:
        typed["settings"] = RecordedSettings.from_dict(values["settings"])
    if kind is MlmRunFile:
        typed["settings"] = MlmSettings.from_dict({**values["settings"], "seed": values["seed"]})
    return kind(**typed)


def multitask_run(values: dict, source: str) -> MultitaskRunFile:
    """A multitask run from its joined files' values (``source`` names them in errors)."""
    return _typed(MultitaskRunFile, Path(source), dict(values))


def read_run(kind: type[Run], path: Path) -> Run:
    """One run of ``kind`` from its metrics file ``path`` (and the record beside it)."""
    return _typed(kind, Path(path), read_result(path))


def read_runs(kind: type[Run], directory: Path) -> list[Run]:
    """Every run of a stage's metrics folder, by name; none when it does not exist."""
    return [read_run(kind, p) for p in sorted(Path(directory).glob("*.json")) if not is_record(p)]
