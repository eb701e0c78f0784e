"""The long tables behind dvc.yaml's top-level plots, a row per configuration and epoch (or
step), coloured by ``config``: ``epochs.csv`` (averages on validation, dev and training
slices, dev losses), ``losses.csv`` (training losses every few steps), ``conflicts.csv``
(PCGrad runs only). Every row has every value its plots draw, so no plot is drawn empty or at 0."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minbert.results import CONFLICTS, COSINE_COLUMNS, HISTORY, STEP_LOSSES, history_column, loss_part_column
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS

EPOCH_COLUMNS = [history_column(split, AVERAGE) for split in ("val", "dev", "train")] + [
    history_column("dev", TASKS[t].loss_key) for t in MULTITASK_TASKS
]
LOSS_COLUMNS = [loss_part_column("loss", t) for t in MULTITASK_TASKS]


def _configs(directory: Path, suffix: str) -> dict[str, pd.DataFrame]:
    return {
        path.name[: -len(suffix)]: pd.read_csv(path) for path in sorted(Path(directory).glob(f"*{suffix}"))
    }


def _history_table(multitask_dir: Path, columns: list[str], trained_only: bool) -> pd.DataFrame:
    frames = []
    for config, history in _configs(multitask_dir, HISTORY).items():
        if trained_only:
            history = history[history.epoch > 0]
        frames.append(history.reindex(columns=["epoch", *columns]).assign(config=config))
    if not frames:
        return pd.DataFrame(columns=["config", "epoch", *columns])
    return pd.concat(frames, ignore_index=True)[["config", "epoch", *columns]]


def epochs_table(multitask_dir: Path) -> pd.DataFrame:
    return _history_table(multitask_dir, EPOCH_COLUMNS, trained_only=False)


def losses_table(multitask_dir: Path) -> pd.DataFrame:
    """The training loss every few optimizer steps (each run's ``-steps.csv``), so that a
    run of one epoch draws a curve too."""
    frames = [
        log.reindex(columns=["epoch", "step", *LOSS_COLUMNS]).assign(config=config)
        for config, log in _configs(multitask_dir, STEP_LOSSES).items()
        if not log.empty
    ]
    if not frames:
        return pd.DataFrame(columns=["config", "epoch", "step", *LOSS_COLUMNS])
    return pd.concat(frames, ignore_index=True)[["config", "epoch", "step", *LOSS_COLUMNS]]


def conflicts_table(multitask_dir: Path) -> pd.DataFrame:
    frames = []
    for config, log in _configs(multitask_dir, CONFLICTS).items():
        if log.empty:  # header only: no PCGrad steps
            continue
        cosines = [c for c in COSINE_COLUMNS if c in log.columns]
        running = (log.conflicts.cumsum() / log.pairs.cumsum()).round(4)
        frames.append(log[["step", *cosines]].assign(config=config, conflicts_so_far=running))
    if not frames:
        return pd.DataFrame(columns=["config", "step", "conflicts_so_far"])
    table = pd.concat(frames, ignore_index=True)
    return table[["config", "step", "conflicts_so_far", *(c for c in COSINE_COLUMNS if c in table.columns)]]


def write_plot_tables(metrics_dir: Path, out_dir: Path) -> None:
    """``epochs.csv``, ``losses.csv`` and ``conflicts.csv`` of the multitask runs under
    ``metrics_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    multitask_dir = Path(metrics_dir) / "multitask"
    epochs_table(multitask_dir).to_csv(out_dir / "epochs.csv", index=False)
    losses_table(multitask_dir).to_csv(out_dir / "losses.csv", index=False)
    conflicts_table(multitask_dir).to_csv(out_dir / "conflicts.csv", index=False)
