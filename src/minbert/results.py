"""A run's results on disk: the metrics file DVC shows, and the run's record beside it.

Each training or scoring stage writes two JSON files per run:

* ``<name>.json``, the metrics file (``dvc metrics show``, ``dvc metrics diff``,
  ``dvc exp show``): the measured numbers a user compares and nothing else, under
  short keys, so that every run fits one row of a 120-column table: a multitask run's
  per-task scores (``sst``, ``quora``, ``sts``), their ``average``, the chosen
  ``epoch`` and the optimizer ``steps``; a sentiment run's ``accuracy``; an MLM
  run's held-out masked-token ``accuracy`` (its perplexity, a number of up to ten
  characters, would not fit the table: the record has it);
* ``<name>-run.json``, the run's record: how the number was produced (settings,
  checkpoint, data split, seed, device, sizes) and what else it measured (examples
  seen, SMART's terms, PCGrad's conflicts). The report and the model card read it.

``read_result`` joins the two into one mapping; a key may live in one file only.
"""

from __future__ import annotations

import json
from pathlib import Path

from minbert.atomic import atomic_write_text

RECORD_SUFFIX = "-run.json"
# The keys of the metrics files besides the task names (the multitask scores) and
# ``minbert.tasks.AVERAGE``.
EPOCH, STEPS, ACCURACY = "epoch", "steps", "accuracy"


def metrics_file(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.json"


def record_file(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}{RECORD_SUFFIX}"


def is_record(path: str | Path) -> bool:
    return str(path).endswith(RECORD_SUFFIX)


def _json(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"


def write_result(directory: Path, name: str, numbers: dict, record: dict) -> None:
    """The metrics file (``numbers``: flat, numbers only) and the record of one run."""
    overlap = sorted(set(numbers) & set(record))
    if overlap:
        raise ValueError(f"{name}: {overlap} would be stated in both the metrics file and the record")
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: metrics file value {key} = {value!r} is not a number")
    atomic_write_text(record_file(directory, name), _json(record))
    atomic_write_text(metrics_file(directory, name), _json(numbers))


def _read(path: Path) -> dict:
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing (rerun the stage that writes it: dvc repro)") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path}: not a JSON object")
    return content


def read_result(path: Path) -> dict:
    """A run's metrics file (``<name>.json``) joined with its record."""
    path = Path(path)
    numbers = _read(path)
    record = _read(record_file(path.parent, path.name[: -len(".json")]))
    overlap = sorted(set(numbers) & set(record))
    if overlap:
        raise ValueError(f"{path}: {overlap} stated in both the metrics file and its record")
    return {**record, **numbers}


def read_results(directory: Path) -> list[dict]:
    """Every run of a stage's metrics folder, by name; none when the folder does not
    exist (the stage was never run)."""
    return [read_result(path) for path in sorted(Path(directory).glob("*.json")) if not is_record(path)]
