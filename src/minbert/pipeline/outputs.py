"""The files stages write besides their metrics files and records (``minbert.results``):
per-epoch histories, per-step conflict logs and the course-format prediction files,
each written atomically (``minbert.atomic``) so an interrupted stage leaves nothing
DVC could take for a result; and what a multitask run's data came from."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from minbert.atomic import atomic_write_text
from minbert.data.predictions import write_predictions

__all__ = [
    "history_csv",
    "write_conflicts",
    "write_step_losses",
    "write_history",
    "write_predictions",
]


def data_split(manifest: dict) -> dict:
    """Which data a multitask run's numbers come from (the data stage's manifest)."""
    return {"sst": "course train / dev", "sts": "course train / dev", "quora": manifest["quora_split"]}


def history_csv(rows: Sequence[dict]) -> str:
    """A history file's text: one line per epoch (epoch 0 first), the columns in the
    order of the fullest row (epoch 0 has no training losses), empty cells for what a
    row lacks."""
    columns = list(dict.fromkeys(k for row in sorted(rows, key=len, reverse=True) for k in row))
    return pd.DataFrame(list(rows), columns=columns).to_csv(index=False)


def write_history(path: Path, rows: Sequence[dict]) -> None:
    atomic_write_text(path, history_csv(rows))


def write_step_losses(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """The training loss every few steps (``minbert.train.multitask.LOSS_LOG_STEPS``)."""
    atomic_write_text(path, pd.DataFrame(list(rows), columns=list(columns)).to_csv(index=False))


def write_conflicts(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """PCGrad's per-step log; written (header only) for every configuration, so that
    DVC has a fixed output to track."""
    atomic_write_text(path, pd.DataFrame(list(rows), columns=list(columns)).to_csv(index=False))
