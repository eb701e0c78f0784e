"""A run's results on disk: ``<name>.json``, the metrics file DVC shows (only the numbers a
user compares, under short keys, so a run fits one row of a 120-column table), and
``<name>-run.json``, its record (how the numbers were produced and what else was measured;
the report and the model card read it). ``read_result`` joins the two."""

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
