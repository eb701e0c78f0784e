"""The stages' run files, typed both ways: a multitask, sentiment, zero-shot or MLM run
is its metrics file (the numbers DVC shows) and its record (``minbert.results`` names
both), written here from a frozen dataclass whose fields are the files' keys in their
order (``write_run``) and read back into one (``read_run``). The stages write and the
report reads runs only through these, so neither can state a key the other does not
know; a file that lacks a key, or holds one this version does not know, is named in one
line (written by another version of its stage: rerun it), never a KeyError deep in a
page. Torch-free."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar, TypeVar

from minbert.results import is_record, joined_texts, read_result, write_result
from minbert.runs.record_parts import (
    AppliedRate,
    Checkpoint,
    DataSplit,
    MaskedScores,
    MlmCorpus,
    OfflineRun,
    Pretraining,
    RecordedSettings,
    SmartTerms,
    StepExecution,
    WarmupKept,
    ZeroShotRecordedSettings,
    record_form,
)
from minbert.settings import MlmSettings
from minbert.tasks import AVERAGE, MULTITASK_TASKS


@dataclass(frozen=True)
class MultitaskRunFile:
    """``metrics/multitask/<config>.json`` with ``<config>-run.json``."""

    NUMBERS: ClassVar = ("scores", "epoch", "steps")  # the metrics file's; the rest: the record's

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
    # None only in runs written before the rates were recorded (the GPU study's).
    applied_lr: list[AppliedRate] | None = None
    offline_run: OfflineRun | None = None
    # None only in runs written before it was recorded.
    step_execution: StepExecution | None = None
    # Of its task's batches (batch_size) a step takes; stated only where more than one.
    batches_per_step: int | None = None

    @property
    def name(self) -> str:
        return self.config

    @property
    def cuda_graphs(self) -> bool:  # the setting, stated in step_execution
        return self.step_execution is not None and self.step_execution.cuda_graphs


@dataclass(frozen=True)
class SentimentRunFile:
    """``metrics/sentiment/<run>.json`` with ``<run>-run.json``."""

    NUMBERS: ClassVar = ("accuracy", "epoch", "steps")

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

    NUMBERS: ClassVar = ("scores",)

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
    settings: ZeroShotRecordedSettings | None = None  # None: written before it was recorded
    offline_run: OfflineRun | None = None


@dataclass(frozen=True)
class MlmRunFile:
    """``metrics/mlm/<start>.json`` with its record: one MLM pretraining run."""

    NUMBERS: ClassVar = ("accuracy", "steps")

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
        "applied_lr": lambda v: [AppliedRate(**a) for a in v],
        "step_execution": lambda v: StepExecution(**v),
    }
    typed = {k: converters[k](v) if k in converters and v is not None else v for k, v in values.items()}
    if kind in (MultitaskRunFile, ZeroShotRunFile):
        typed["data_split"] = DataSplit.from_dict(values["data_split"])
    if kind is MultitaskRunFile:
        typed["settings"] = RecordedSettings.from_dict(values["settings"])
    if kind is ZeroShotRunFile and values.get("settings") is not None:
        typed["settings"] = ZeroShotRecordedSettings.from_dict(values["settings"], values["seed"])
    if kind is MlmRunFile:
        typed["settings"] = MlmSettings.from_dict({**values["settings"], "seed": values["seed"]})
    return kind(**typed)


def run_from_texts(kind: type[Run], numbers: str, record: str, source: str) -> Run:
    """A run from its two files' texts, as a commit holds them (``git show``); ``source``
    names them in errors."""
    return _typed(kind, Path(source), joined_texts(numbers, record, source))


def read_run(kind: type[Run], path: Path) -> Run:
    """One run of ``kind`` from its metrics file ``path`` (and the record beside it)."""
    return _typed(kind, Path(path), read_result(path))


def read_runs(kind: type[Run], directory: Path) -> list[Run]:
    """Every run of a stage's metrics folder, by name; none when it does not exist."""
    return [read_run(kind, p) for p in sorted(Path(directory).glob("*.json")) if not is_record(p)]


def file_parts(run: Run) -> tuple[dict, dict]:
    """``run`` as its two files state it: the metrics file's numbers (a run's task scores
    flat, under the tasks' names) and the record."""
    numbers, record = {}, {}
    for f in fields(run):
        value = getattr(run, f.name)
        if f.name == "scores":
            numbers |= value
        elif f.name in run.NUMBERS:
            numbers[f.name] = value
        elif not (f.default is None and value is None):
            record[f.name] = record_form(value)
    return numbers, record


def joined(run: Run) -> dict:
    """``run``'s two files joined, as ``minbert.results.read_result`` reads them back."""
    numbers, record = file_parts(run)
    return {**record, **numbers}


def write_run(run: Run, directory: Path, name: str) -> dict:
    """``run``'s metrics file and record, ``<name>.json`` and ``<name>-run.json`` in
    ``directory``; returns the two joined."""
    numbers, record = file_parts(run)
    write_result(Path(directory), name, numbers, record)
    return {**record, **numbers}
