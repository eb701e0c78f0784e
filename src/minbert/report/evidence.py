"""The evidence behind every number of the report: each run's dev predictions joined with
the dev labels, the number recomputed from them (it must equal the metrics file's) and its
bootstrap intervals, resampled in whole question groups where the table has them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from minbert.data.predictions import read_predictions
from minbert.metrics import (
    Interval,
    Resamples,
    average_interval,
    fixed,
    interval,
    paired,
    paired_average,
    score,
)
from minbert.tasks import AVERAGE, TASKS

# Two score predictions that are one increasing affine map of each other, each written to
# STS_DECIMALS, correlate above this (r = 1 but for the rounding): the same answers.
AFFINE_R = 1 - 1e-6


@dataclass
class Scored:
    """One run's dev labels and predictions per task, in the same example order."""

    name: str
    labels: dict[str, np.ndarray]
    predictions: dict[str, np.ndarray]
    #: Cluster ids (question groups) of a task's examples, for tasks whose dev table has them.
    groups: dict[str, np.ndarray] = field(default_factory=dict)

    def answers(self, task: str) -> str:
        """What an interval of this run on ``task`` depends on beyond the dev set: its
        predictions' bytes (runs that answer alike share their intervals)."""
        return hashlib.sha256(np.ascontiguousarray(self.predictions[task]).tobytes()).hexdigest()


class Evidence:
    """Reads labels and predictions once and computes each interval once; its bootstraps
    share their draws (``resamples``, which another Evidence on the same dev sets can share)."""

    def __init__(
        self,
        predictions_dir: Path,
        prepared_dir: Path,
        resamples: Resamples | None = None,
        elsewhere: dict[str, Path] | None = None,
    ):
        self.predictions_dir, self.prepared_dir = Path(predictions_dir), Path(prepared_dir)
        # Runs whose predictions lie outside predictions_dir: their folder there -> where.
        self.elsewhere = {k: Path(v) for k, v in (elsewhere or {}).items()}
        self.resamples = resamples or Resamples()
        self._labels: dict[str, pd.Series] = {}
        self._groups: dict[str, pd.Series | None] = {}
        self._intervals: dict[tuple, Interval] = {}
        self._scored: dict[str, Scored] = {}

    def labels(self, task: str) -> pd.Series:
        """The dev labels of ``task``, indexed by example id."""
        if task not in self._labels:
            path = self.prepared_dir / f"{task}-dev.parquet"
            if not path.is_file():
                raise FileNotFoundError(f"{path}: no prepared dev table (run `dvc repro prepare`)")
            try:
                frame = pd.read_parquet(path)
            except (pa.ArrowException, OSError) as exc:
                raise ValueError(
                    f"{path}: not a readable Parquet table ({exc}); run `dvc repro prepare`"
                ) from None
            ids = frame["id"].astype(str)
            self._labels[task] = pd.Series(frame["label"].to_numpy(float), index=ids)
            self._groups[task] = pd.Series(frame["group"].to_numpy(), index=ids) if "group" in frame else None
        return self._labels[task]

    def groups(self, task: str) -> pd.Series | None:
        """The question group of each dev example of ``task``, indexed by example id, or
        None when its prepared dev table has no ``group`` column."""
        self.labels(task)
        return self._groups[task]

    def scored(self, name: str, files: dict[str, Path], metrics: dict[str, float]) -> Scored:
        """The predictions in ``files`` (task -> file under the predictions folder) joined
        with the labels; ``metrics`` (task -> the metrics file's number) must be what
        the predictions score. Read once per run ``name``."""
        if name not in self._scored:
            self._scored[name] = self._read(name, files, metrics)
        return self._scored[name]

    def _read(self, name: str, files: dict[str, Path], metrics: dict[str, float]) -> Scored:
        labels, predictions, groups = {}, {}, {}
        for task, file in files.items():
            folder = Path(file).parent.as_posix()
            path = (
                self.elsewhere[folder] / Path(file).name
                if folder in self.elsewhere
                else self.predictions_dir / file
            )
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path}: the dev predictions of {name} are missing (rerun its stage: dvc repro)"
                )
            predicted = read_predictions(path)
            truth = self.labels(task)
            if set(predicted) != set(truth.index):
                raise ValueError(
                    f"{path}: predicts {len(predicted)} examples, the dev set has "
                    f"{len(truth)}; they are not the same examples"
                )
            labels[task] = truth.to_numpy()
            if (clusters := self.groups(task)) is not None:
                groups[task] = clusters.to_numpy()  # in the order of the labels
            predictions[task] = np.array([float(predicted[i]) for i in truth.index])
            recomputed = fixed(score(task, labels[task], predictions[task]))
            if recomputed != metrics[task]:
                raise ValueError(
                    f"{path}: these predictions score {recomputed}, but the metrics "
                    f"file of {name} says {metrics[task]}: they come from different runs"
                )
        return Scored(name, labels, predictions, groups)

    def _cached(self, key: tuple, compute) -> Interval:
        # Keyed by what is resampled (the kind, the tasks, the answers), not by run names:
        # two runs that answer alike (the starts of configurations that share one) are
        # bootstrapped once.
        if key not in self._intervals:
            self._intervals[key] = compute()
        return self._intervals[key]

    def cell(self, run: Scored, task: str) -> Interval:
        return self._cached(
            ("cell", task, run.answers(task)),
            lambda: interval(
                task,
                run.labels[task],
                run.predictions[task],
                groups=run.groups.get(task),
                resamples=self.resamples,
            ),
        )

    def average(self, run: Scored) -> Interval:
        return self._cached(
            ("average", *((t, run.answers(t)) for t in run.labels)),
            lambda: average_interval(
                [(t, run.labels[t], run.predictions[t], run.groups.get(t)) for t in run.labels],
                resamples=self.resamples,
            ),
        )

    def difference(self, run: Scored, parent: Scored, task: str) -> Interval:
        """``run`` minus ``parent`` on ``task``'s examples (paired)."""
        return self._cached(
            ("difference", task, run.answers(task), parent.answers(task)),
            lambda: paired(
                task,
                run.labels[task],
                run.predictions[task],
                parent.predictions[task],
                groups=run.groups.get(task),
                resamples=self.resamples,
            ),
        )

    def average_difference(self, run: Scored, parent: Scored) -> Interval:
        return self._cached(
            ("average difference", *((t, run.answers(t), parent.answers(t)) for t in run.labels)),
            lambda: paired_average(
                [
                    (t, run.labels[t], run.predictions[t], parent.predictions[t], run.groups.get(t))
                    for t in run.labels
                ],
                resamples=self.resamples,
            ),
        )

    def selection_difference(self, run: Scored, parent: Scored) -> Interval:
        """``run`` minus ``parent`` in the mean of the tasks' chance-corrected selection
        metrics (paired): what ranks configurations, which a constant answer cannot win."""
        return self._cached(
            ("selection difference", *((t, run.answers(t), parent.answers(t)) for t in run.labels)),
            lambda: paired_average(
                [
                    (t, run.labels[t], run.predictions[t], parent.predictions[t], run.groups.get(t))
                    for t in run.labels
                ],
                selection=True,
                resamples=self.resamples,
            ),
        )

    def column(self, run: Scored, column: str) -> Interval:
        """A table column's cell: a task's metric, or ``AVERAGE``."""
        return self.average(run) if column == AVERAGE else self.cell(run, column)

    def value(self, run: Scored, column: str) -> float:
        """:meth:`column`'s ``value`` without the bootstrap, for a cell that shows none."""
        if column == AVERAGE:
            return float(np.mean([score(t, run.labels[t], run.predictions[t]) for t in run.labels]))
        return score(column, run.labels[column], run.predictions[column])

    def same_answers(self, run: Scored, other: Scored, column: str) -> bool:
        """Whether ``run`` answers as ``other`` in a table column: the same classes, or
        scores one increasing affine map of the other's (so the same Pearson's r), each task."""
        tasks = list(run.labels) if column == AVERAGE else [column]
        for task in tasks:
            mine, theirs = run.predictions[task], other.predictions[task]
            if TASKS[task].label_kind == "class" or np.ptp(mine) == 0 or np.ptp(theirs) == 0:
                if not np.array_equal(mine, theirs):
                    return False
            elif np.corrcoef(mine, theirs)[0, 1] < AFFINE_R:
                return False
        return True

    def column_difference(self, run: Scored, parent: Scored, column: str) -> Interval:
        """``run`` minus ``parent`` in a table column (paired)."""
        if column == AVERAGE:
            return self.average_difference(run, parent)
        return self.difference(run, parent, column)
