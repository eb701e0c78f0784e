"""Prediction files in the course's submission format (``id , Predicted_<Field>``, then one
``<id> , <prediction>`` line per example): classes as integers, STS scores with
``minbert.metrics.STS_DECIMALS`` decimals."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from minbert.atomic import atomic_write_text
from minbert.metrics import STS_DECIMALS
from minbert.tasks import TASKS

PREDICTION_FIELDS = {
    "sst": "Predicted_Sentiment",
    "cfimdb": "Predicted_Sentiment",
    "quora": "Predicted_Is_Paraphrase",
    "sts": "Predicted_Similiarity",  # sic: the course's spelling, kept for its grader
}


def _value(task: str, prediction) -> str:
    if TASKS[task].label_kind == "score":
        return f"{float(prediction):.{STS_DECIMALS}f}"
    return str(int(prediction))


def format_predictions(task: str, ids: Sequence[str], predictions: Sequence) -> str:
    lines = [f"id \t {PREDICTION_FIELDS[task]} "]
    lines += [f"{i} , {_value(task, p)} " for i, p in zip(ids, predictions, strict=True)]
    return "\n".join(lines) + "\n"


def write_predictions(path: Path, task: str, ids: Sequence[str], predictions: Sequence) -> None:
    atomic_write_text(path, format_predictions(task, ids, predictions))


def read_predictions(path: Path) -> dict[str, str]:
    """Read a prediction file back (for tests and the report)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    out = {}
    for line in lines[1:]:
        ident, _, value = line.partition(" , ")
        out[ident.strip()] = value.strip()
    return out
