"""A run's results on disk: ``<name>.json``, the metrics file DVC shows (only the numbers a
user compares, under short keys, so a run fits one row of a 120-column table), and
``<name>-run.json``, its record (how the numbers were produced and what else was measured;
the report and the model card read it). ``read_result`` joins the two. A multitask run's
history, an ``EpochScores`` per epoch, is written as ``<name>-history.csv``, whose columns
``history_column`` names for every writer and reader."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from minbert.atomic import atomic_write_text
from minbert.tasks import MULTITASK_TASKS

RECORD_SUFFIX = "-run.json"
# The keys of the metrics files besides the task names (the multitask scores) and
# ``minbert.tasks.AVERAGE``.
EPOCH, STEPS, ACCURACY = "epoch", "steps", "accuracy"


# A run's logs beside its metrics file (``run_log``): its history by epoch; a multitask
# run's training losses every few steps and PCGrad's gradient cosines per step.
HISTORY, STEP_LOSSES, CONFLICTS = "-history.csv", "-steps.csv", "-conflicts.csv"


def run_log(directory: Path, name: str, kind: str) -> Path:
    """Run ``name``'s log of ``kind`` (``HISTORY``, ``STEP_LOSSES`` or ``CONFLICTS``)."""
    return Path(directory) / f"{name}{kind}"


def cosine_column(a: str, b: str) -> str:
    """The conflict log's column of the cosine between tasks ``a`` and ``b``'s gradients."""
    return f"cos_{a}_{b}"


# Each pair of tasks (i < j in MULTITASK_TASKS' order) and its conflict-log column.
TASK_PAIRS: tuple[tuple[str, str], ...] = tuple(itertools.combinations(MULTITASK_TASKS, 2))
COSINE_COLUMNS: tuple[str, ...] = tuple(cosine_column(a, b) for a, b in TASK_PAIRS)


def history_column(split: str, key: str) -> str:
    """A history file's column: what ``split`` scored (``val``, the validation split;
    ``dev`` and ``train``, the fixed slices) under ``key`` (a metric, selection or loss key of
    ``minbert.tasks``), or a training loss part of a task (``train_adversarial_sts``)."""
    return f"{split}_{key}"


def loss_part_column(part: str, task: str) -> str:
    """The column of the epoch's mean training ``part`` (``minbert.train.smart.LOSS_PARTS``) of
    ``task``: ``train_loss_sst`` is the task's own loss."""
    return history_column("train", f"{part}_{task}")


@dataclass(frozen=True)
class EpochScores:
    """One epoch of a multitask run's history (0: the start): its learning rate and mean training
    losses (none at epoch 0), then the scores of the validation split, the dev slice (none
    when dev is not scored) and the training slice, each by ``minbert.tasks`` keys."""

    epoch: int
    lr: float | None
    losses: dict[str, dict[str, float]]  # part (LOSS_PARTS) -> task -> the epoch's mean
    validation: dict[str, float]
    dev: dict[str, float]
    train: dict[str, float]

    def row(self) -> dict:
        """The history file's line (columns: ``minbert.results.history_column``)."""
        row = {"epoch": self.epoch, "lr": self.lr}
        row |= {
            loss_part_column(part, t): self.losses[part][t] for t in MULTITASK_TASKS for part in self.losses
        }
        row |= {history_column("val", k): v for k, v in self.validation.items()}
        row |= {history_column("dev", k): v for k, v in self.dev.items()}
        return row | {history_column("train", k): v for k, v in self.train.items()}


def metrics_file(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.json"


def record_file(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}{RECORD_SUFFIX}"


def is_record(path: str | Path) -> bool:
    return str(path).endswith(RECORD_SUFFIX)


def _json(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"


def _numbers_only(numbers: dict, source: str) -> dict:
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{source}: metrics file value {key} = {value!r} is not a number")
    return numbers


def write_result(directory: Path, name: str, numbers: dict, record: dict) -> None:
    """The metrics file (``numbers``: flat, numbers only) and the record of one run."""
    overlap = sorted(set(numbers) & set(record))
    if overlap:
        raise ValueError(f"{name}: {overlap} would be stated in both the metrics file and the record")
    _numbers_only(numbers, name)
    atomic_write_text(record_file(directory, name), _json(record))
    atomic_write_text(metrics_file(directory, name), _json(numbers))


def _parsed(text: str, source: str) -> dict:
    try:
        content = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(content, dict):
        raise ValueError(f"{source}: not a JSON object")
    return content


def _read(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing (rerun the stage that writes it: dvc repro)") from None
    return _parsed(text, str(path))


def _joined(numbers: dict, record: dict, source: str) -> dict:
    overlap = sorted(set(numbers) & set(record))
    if overlap:
        raise ValueError(f"{source}: {overlap} stated in both the metrics file and its record")
    return {**record, **numbers}


def metrics_from_text(text: str, source: str) -> dict[str, float]:
    """A metrics file's numbers from its text (a commit's, ``git show``): flat, numbers
    only, or one line naming ``source`` and the key that is not."""
    return _numbers_only(_parsed(text, source), source)


def joined_texts(numbers: str, record: str, source: str) -> dict:
    """A run's metrics file and record from their texts (a commit's, ``git show``), joined."""
    return _joined(_parsed(numbers, source), _parsed(record, f"{source} (record)"), source)


def read_result(path: Path) -> dict:
    """A run's metrics file (``<name>.json``) joined with its record."""
    path = Path(path)
    numbers = _read(path)
    record = _read(record_file(path.parent, path.name[: -len(".json")]))
    return _joined(numbers, record, str(path))


def read_results(directory: Path) -> list[dict]:
    """Every run of a stage's metrics folder, by name; none when the folder does not
    exist (the stage was never run)."""
    return [read_result(path) for path in sorted(Path(directory).glob("*.json")) if not is_record(path)]
