"""Task metrics, their names, the precision they are written at, and their uncertainty.

Defined once here and used by the training loops, the report and the command line:

* the metric of each task (accuracy for SST, CFIMDB and Quora; Pearson's r for STS)
  and the key it is stored under in metrics files;
* the fixed precision of every number a stage writes (``fixed``) and of STS
  predictions (``STS_DECIMALS``). The same seed and code give bit-identical numbers
  on one machine, but CPUs of another vendor or generation run other kernels
  (another order of floating-point additions), which moves results in the 7th
  decimal; written at this precision, the files are the same bytes on both;
* 95% intervals from a bootstrap over dev examples (``interval``), a paired bootstrap
  of the difference between two models scored on the same examples (``paired``),
  and one for the average of several tasks, each resampled on its own
  (``average_interval``). The resampling is scipy's (``scipy.stats.bootstrap``,
  percentile method, 9,999 resamples, a seeded generator); what is resampled is
  the index of the examples, so labels and predictions stay paired.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from sklearn.metrics import accuracy_score

# The multitask tasks, in the order every table and history file uses.
MULTITASK_TASKS = ("sst", "quora", "sts")
# Key of each task's metric in metrics files and history columns.
METRIC = {"sst": "sst_accuracy", "quora": "quora_accuracy", "sts": "sts_pearson", "cfimdb": "cfimdb_accuracy"}
METRIC_TITLE = {"sst": "SST acc", "quora": "Quora acc", "sts": "STS Pearson", "cfimdb": "CFIMDB acc"}
AVERAGE = "average"  # plain mean of the three multitask metrics

# Decimals of every measured number written to a metrics or history file.
DECIMALS = 4
# Decimals of an STS prediction (0-5 scale) in prediction files; metrics are computed
# from the predictions as written, so a file and its score always agree.
STS_DECIMALS = 3

BOOTSTRAP_RESAMPLES = 9999
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0


def fixed(x: float | None) -> float | None:
    """``x`` at the written precision (None and NaN pass through)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isnan(x) else round(x, DECIMALS) + 0.0  # + 0.0: no "-0.0"


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    return float(accuracy_score(labels, predictions))


def pearson(labels: np.ndarray, predictions: np.ndarray) -> float:
    labels, predictions = np.asarray(labels, float), np.asarray(predictions, float)
    if labels.std() == 0 or predictions.std() == 0:
        return 0.0  # undefined; a constant predictor carries no correlation
    return float(np.corrcoef(labels, predictions)[0, 1])


def score(task: str, labels: np.ndarray, predictions: np.ndarray) -> float:
    """The task's metric: Pearson's r for STS, accuracy otherwise."""
    return pearson(labels, predictions) if task == "sts" else accuracy(labels, predictions)


def as_written(task: str, values: np.ndarray) -> np.ndarray:
    """Predictions as a prediction file holds them: class ids, or STS scores rounded."""
    values = np.asarray(values)
    if task == "sts":
        return np.round(values.astype(float), STS_DECIMALS)
    return values.astype(int)


# ----------------------------------------------------------------------------- bootstrap


def _resampled(task: str, labels: np.ndarray, predictions: np.ndarray):
    """``f(idx)``: the metric on each row of resampled example indices ``idx``.

    Accuracy is the mean of a 0/1 vector computed once; Pearson's r is recomputed
    from the resampled labels and predictions."""
    if task != "sts":
        correct = (labels == predictions).astype(float)
        return lambda idx: correct[idx].mean(axis=-1)

    def r(idx):
        x, y = labels[idx], predictions[idx]
        x = x - x.mean(axis=-1, keepdims=True)
        y = y - y.mean(axis=-1, keepdims=True)
        denominator = np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denominator > 0, (x * y).sum(axis=-1) / denominator, 0.0)

    return r


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict:
        return {"value": fixed(self.value), "low": fixed(self.low), "high": fixed(self.high)}


def _bootstrap(samples: Sequence[np.ndarray], statistic, seed: int) -> tuple[float, float]:
    result = stats.bootstrap(
        tuple(samples),
        statistic,
        n_resamples=BOOTSTRAP_RESAMPLES,
        vectorized=True,
        confidence_level=CONFIDENCE,
        method="percentile",
        batch=500,
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _check(task: str, labels: np.ndarray, *predictions: np.ndarray) -> None:
    for p in predictions:
        if len(p) != len(labels):
            raise ValueError(f"{task}: {len(labels)} labels but {len(p)} predictions")
    if len(labels) < 2:
        raise ValueError(f"{task}: a bootstrap needs at least 2 examples, got {len(labels)}")


def interval(task: str, labels: np.ndarray, predictions: np.ndarray, seed: int = BOOTSTRAP_SEED) -> Interval:
    """The metric with a 95% percentile-bootstrap interval over the examples."""
    labels, predictions = np.asarray(labels, float), np.asarray(predictions, float)
    _check(task, labels, predictions)
    metric = _resampled(task, labels, predictions)
    low, high = _bootstrap([np.arange(len(labels))], lambda idx, axis=-1: metric(idx), seed)
    return Interval(score(task, labels, predictions), low, high)


def paired(
    task: str, labels: np.ndarray, predictions: np.ndarray, reference: np.ndarray, seed: int = BOOTSTRAP_SEED
) -> Interval:
    """``score(predictions) - score(reference)`` on the same examples, with a 95%
    interval from resampling the examples once for both (a paired bootstrap)."""
    labels = np.asarray(labels, float)
    predictions, reference = np.asarray(predictions, float), np.asarray(reference, float)
    _check(task, labels, predictions, reference)
    ours, theirs = _resampled(task, labels, predictions), _resampled(task, labels, reference)
    low, high = _bootstrap([np.arange(len(labels))], lambda idx, axis=-1: ours(idx) - theirs(idx), seed)
    return Interval(score(task, labels, predictions) - score(task, labels, reference), low, high)


def average_interval(
    parts: Sequence[tuple[str, np.ndarray, np.ndarray]], seed: int = BOOTSTRAP_SEED
) -> Interval:
    """The plain mean of several tasks' metrics, each task's examples resampled on
    their own (they are different examples): ``parts`` holds (task, labels, predictions)."""
    parts = [(t, np.asarray(y, float), np.asarray(p, float)) for t, y, p in parts]
    for t, y, p in parts:
        _check(t, y, p)
    metrics = [_resampled(t, y, p) for t, y, p in parts]

    def statistic(*indices, axis=-1):
        return np.mean([metric(i) for metric, i in zip(metrics, indices)], axis=0)

    low, high = _bootstrap([np.arange(len(y)) for _, y, _ in parts], statistic, seed)
    return Interval(float(np.mean([score(t, y, p) for t, y, p in parts])), low, high)


def paired_average(
    parts: Sequence[tuple[str, np.ndarray, np.ndarray, np.ndarray]], seed: int = BOOTSTRAP_SEED
) -> Interval:
    """The difference of two models' averages, each task paired on its own examples:
    ``parts`` holds (task, labels, predictions, reference predictions)."""
    parts = [(t, np.asarray(y, float), np.asarray(p, float), np.asarray(r, float)) for t, y, p, r in parts]
    for t, y, p, r in parts:
        _check(t, y, p, r)
    metrics = [(_resampled(t, y, p), _resampled(t, y, r)) for t, y, p, r in parts]

    def statistic(*indices, axis=-1):
        return np.mean([ours(i) - theirs(i) for (ours, theirs), i in zip(metrics, indices)], axis=0)

    low, high = _bootstrap([np.arange(len(y)) for _, y, _, _ in parts], statistic, seed)
    value = float(np.mean([score(t, y, p) - score(t, y, r) for t, y, p, r in parts]))
    return Interval(value, low, high)
