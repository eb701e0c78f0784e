"""Task metrics, their precision and their uncertainty, used by the training loops, the
report and the command line. The metrics (accuracy, Pearson's r) and the chance-corrected
ones that choose (Matthews' correlation, Pearson's r; a constant answer scores 0); the
fixed precision every written number has (``fixed``, ``STS_DECIMALS``: CPUs of another
kind move results in the 7th decimal, and the files stay the same bytes); 95% bootstrap
intervals (scipy's percentile bootstrap, 9,999 resamples, seeded) of a score, of a paired
difference and of a mean over tasks (each task resampled on its own). Given ``groups``
(Quora's question groups, pairs that share a question and tend to share their errors), the
bootstrap draws whole clusters; Pearson's r has no clustered form."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from scipy import stats
from sklearn.metrics import accuracy_score, matthews_corrcoef

from minbert.tasks import TASKS

# Decimals of every measured number written to a metrics or history file.
DECIMALS = 4
# Decimals of an STS prediction (0-5 scale) in prediction files; metrics are computed
# from the predictions as written, so a file and its score always agree.
STS_DECIMALS = 3

BOOTSTRAP_RESAMPLES = 9999
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0
_BATCH = 500  # resamples drawn and scored at once


def fixed(x: float | None) -> float | None:
    """``x`` at the written precision (None and NaN pass through)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isnan(x) else round(x, DECIMALS) + 0.0  # + 0.0: no "-0.0"


def correlation_noise(r: float, n: int) -> float:
    """The standard error of a correlation ``r`` (an MCC, a Pearson) on ``n`` rows,
    √((1 − r²) / (n − 2)): how far the rows drawn alone can move it."""
    return math.sqrt(max(1 - r * r, 0.0) / max(n - 2, 1))


def rises_beyond(score: float, reference: float | None, margin: Callable[[float], float]) -> bool:
    """The plateau rule: ``score`` above ``reference`` (the last epoch that rose; None: the
    first) by more than ``margin(reference)``. Patience counts the epochs that do not."""
    return reference is None or score > reference + margin(reference)


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    return float(accuracy_score(labels, predictions))


def pearson(labels: np.ndarray, predictions: np.ndarray) -> float:
    labels, predictions = np.asarray(labels, float), np.asarray(predictions, float)
    if labels.std() == 0 or predictions.std() == 0:
        return 0.0  # undefined; a constant predictor carries no correlation
    return float(np.corrcoef(labels, predictions)[0, 1])


def mcc(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Matthews' correlation (its multiclass form for more than two classes): 0 for
    any constant answer and for chance, 1 for a perfect one."""
    return float(matthews_corrcoef(np.asarray(labels).astype(int), np.asarray(predictions).astype(int)))


def score(task: str, labels: np.ndarray, predictions: np.ndarray) -> float:
    """The task's metric (its record's ``metric``): accuracy or Pearson's r."""
    return (accuracy if TASKS[task].metric == "accuracy" else pearson)(labels, predictions)


def selection_score(task: str, labels: np.ndarray, predictions: np.ndarray) -> float:
    """The task's chance-corrected selection metric (its record's ``selection_metric``):
    Matthews' correlation or Pearson's r."""
    return (mcc if TASKS[task].selection_metric == "mcc" else pearson)(labels, predictions)


def as_written(task: str, values: np.ndarray) -> np.ndarray:
    """Predictions as a prediction file holds them: class ids, or scores rounded."""
    values = np.asarray(values)
    if TASKS[task].label_kind == "score":
        return np.round(values.astype(float), STS_DECIMALS)
    return values.astype(int)


# ----------------------------------------------------------------------------- bootstrap


@dataclass(frozen=True)
class _Clusters:
    """Examples grouped for a cluster bootstrap: ``index[i]`` is the cluster (0..n-1)
    of example ``i``, ``counts[c]`` the number of examples in cluster ``c``."""

    index: np.ndarray
    counts: np.ndarray

    def __len__(self) -> int:
        return len(self.counts)


def _clusters(task: str, groups: np.ndarray | None, n: int) -> _Clusters | None:
    """The clusters of ``groups`` (one id per example, any hashable values), or None."""
    if groups is None:
        return None
    groups = np.asarray(groups)
    if groups.ndim != 1 or len(groups) != n:
        raise ValueError(f"{task}: {n} labels but {groups.size} cluster ids")
    _, index, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if len(counts) < 2:
        raise ValueError(f"{task}: a cluster bootstrap needs at least 2 clusters, got {len(counts)}")
    return _Clusters(index, counts)


def _size(labels: np.ndarray, clusters: _Clusters | None) -> int:
    """How many units the bootstrap resamples: the examples, or the clusters."""
    return len(labels) if clusters is None else len(clusters)


def _per_unit(values: np.ndarray, clusters: _Clusters | None) -> np.ndarray:
    """Per example, or summed per cluster: what a resample of the units adds up."""
    if clusters is None:
        return values
    return np.stack(
        [np.bincount(clusters.index, weights=v, minlength=len(clusters)) for v in values.T], axis=1
    )


def _count_columns(task: str, metric: str, labels: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """Per example, what accuracy and MCC are computed from: correct, then (MCC) the one-hot
    true and answered classes, then a column of ones (the count)."""
    correct = (labels == predictions).astype(float)[:, None]
    if metric == "mcc":
        classes = np.arange(TASKS[task].num_classes)
        truth = (labels[:, None] == classes).astype(float)
        answered = (predictions[:, None] == classes).astype(float)
        correct = np.concatenate([correct, truth, answered], axis=1)
    return np.concatenate([correct, np.ones((len(labels), 1))], axis=1)


def _from_counts(task: str, metric: str, sums: np.ndarray) -> np.ndarray:
    """Accuracy or MCC from the drawn units' summed :func:`_count_columns`."""
    hits, n = sums[..., 0], sums[..., -1]
    if metric == "accuracy":
        return hits / n
    k = TASKS[task].num_classes
    truth, answered = sums[..., 1 : 1 + k], sums[..., 1 + k : 1 + 2 * k]
    # Gorodkin's multiclass form (the binary MCC for two classes).
    covariance = hits * n - (truth * answered).sum(axis=-1)
    scale = np.sqrt((n * n - (answered * answered).sum(axis=-1)) * (n * n - (truth * truth).sum(axis=-1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(scale > 0, covariance / scale, 0.0)


def _centered(rows: np.ndarray) -> np.ndarray:
    return rows - rows.mean(axis=-1, keepdims=True)


def _pearson_rows(x: np.ndarray, x_squares: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of each row of ``x`` (its sums of squares given) with the same row of
    ``y``, both :func:`_centered`."""
    denominator = np.sqrt(x_squares * (y * y).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (x * y).sum(axis=-1) / denominator, 0.0)


def _digest(*arrays: np.ndarray | None) -> str:
    parts = (b"-" if a is None else np.ascontiguousarray(a).tobytes() + b"|" for a in arrays)
    return hashlib.sha256(b"".join(parts)).hexdigest()


def _scorer(
    task: str, metric: str, labels: np.ndarray, predictions: np.ndarray, clusters: _Clusters | None
) -> Callable[[Drawn], np.ndarray]:
    """``metric`` of ``predictions`` on each resample of a batch, remembered by the batch (a model
    compared with several is scored once): accuracy and MCC from the drawn units' counts."""
    key = (task, metric, _digest(labels, predictions, None if clusters is None else clusters.index))
    if metric in ("accuracy", "mcc"):
        units = _per_unit(_count_columns(task, metric, labels, predictions), clusters)

        def compute(drawn: Drawn) -> np.ndarray:
            # The drawn units' summed counts: integers, exact in float64 in any order.
            return _from_counts(task, metric, drawn.counts @ units)

    elif clusters is not None:
        raise ValueError(
            f"{task}: Pearson's r has no cluster bootstrap here (STS pairs are not grouped); "
            "leave out its cluster ids"
        )
    else:
        labels_key = ("centered labels", _digest(labels))

        def centered_labels(drawn: Drawn) -> tuple[np.ndarray, np.ndarray]:
            x = _centered(labels[drawn.indices])
            return x, (x * x).sum(axis=-1)

        def compute(drawn: Drawn) -> np.ndarray:
            x, x_squares = drawn.remember(labels_key, lambda: centered_labels(drawn))
            return _pearson_rows(x, x_squares, _centered(predictions[drawn.indices]))

    return lambda drawn: drawn.remember(key, lambda: compute(drawn))


def _resampled(
    task: str,
    labels: np.ndarray,
    predictions: np.ndarray,
    clusters: _Clusters | None = None,
    selection: bool = False,
    reference: np.ndarray | None = None,
) -> Callable[[Drawn], np.ndarray]:
    """The metric (``selection``: the selection metric) on each resample of a batch of examples,
    or of ``clusters``, minus the reference's on the same draws when ``reference`` is given."""
    spec = TASKS[task]
    metric = spec.selection_metric if selection else spec.metric
    scored = _scorer(task, metric, labels, predictions, clusters)
    if reference is None:
        return scored
    referenced = _scorer(task, metric, labels, reference, clusters)
    return lambda drawn: scored(drawn) - referenced(drawn)


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


@dataclass
class Drawn:
    """A batch of one sample's resamples (rows of drawn units), and what was computed on it."""

    indices: np.ndarray  # (rows, n) int32
    _remembered: dict = field(default_factory=dict, repr=False)

    def remember(self, key: tuple, compute: Callable[[], Any]) -> Any:
        if key not in self._remembered:
            self._remembered[key] = compute()
        return self._remembered[key]

    @cached_property
    def counts(self) -> np.ndarray:  # how often each row drew each unit
        rows, n = self.indices.shape
        flat = (self.indices + n * np.arange(rows)[:, None]).reshape(-1)
        counts = np.bincount(flat, minlength=rows * n).reshape(rows, n)
        return counts.astype(np.min_scalar_type(counts.max()))


class Resamples:
    """scipy.stats.bootstrap's draws: batches of 500 rows from ``default_rng(seed)``, made
    here as int32 (numpy draws the same numbers as int64 below 2**32, in half the bytes).
    ``keep``: bootstraps of the same sizes and seed share one set of draws (the report's
    ~300 intervals draw five sets; about 5 bytes per unit and resample); otherwise each
    batch is dropped once scored."""

    def __init__(self, keep: bool = True):
        self._kept: dict[tuple, list[list[Drawn]]] | None = {} if keep else None

    def batches(self, sizes: Sequence[int], seed: int) -> Iterable[list[Drawn]]:
        rng, key = np.random.default_rng(seed), (tuple(sizes), seed, BOOTSTRAP_RESAMPLES)
        drawn = (
            [
                Drawn(rng.integers(0, n, (min(_BATCH, BOOTSTRAP_RESAMPLES - at), n), dtype=np.int32))
                for n in sizes
            ]
            for at in range(0, BOOTSTRAP_RESAMPLES, _BATCH)
        )
        if self._kept is None:
            return drawn
        if key not in self._kept:
            self._kept[key] = list(drawn)
        return self._kept[key]


def _bootstrap(
    sizes: Sequence[int], statistic, seed: int, resamples: Resamples | None = None
) -> tuple[float, float]:
    """scipy.stats.bootstrap's percentile interval (vectorized, batches of 500) of
    ``statistic(*drawn)``, one :class:`Drawn` per sample of units 0..n-1 of each size: the
    same draws, and no gather of ``arange(n)``."""
    values = [statistic(*batch) for batch in (resamples or Resamples(keep=False)).batches(sizes, seed)]
    alpha = (1 - CONFIDENCE) / 2
    low, high = stats.quantile(np.concatenate(values, axis=-1), np.asarray([alpha, 1 - alpha]), axis=-1)
    return float(low), float(high)


def _check(task: str, labels: np.ndarray, *predictions: np.ndarray) -> None:
    for p in predictions:
        if len(p) != len(labels):
            raise ValueError(f"{task}: {len(labels)} labels but {len(p)} predictions")
    if len(labels) < 2:
        raise ValueError(f"{task}: a bootstrap needs at least 2 examples, got {len(labels)}")


def interval(
    task: str,
    labels: np.ndarray,
    predictions: np.ndarray,
    seed: int = BOOTSTRAP_SEED,
    *,
    groups: np.ndarray | None = None,
    resamples: Resamples | None = None,
) -> Interval:
    """The metric with a 95% percentile-bootstrap interval over the examples, or over
    whole clusters of them when ``groups`` (one cluster id per example) is given."""
    labels, predictions = np.asarray(labels, float), np.asarray(predictions, float)
    _check(task, labels, predictions)
    clusters = _clusters(task, groups, len(labels))
    metric = _resampled(task, labels, predictions, clusters)
    low, high = _bootstrap([_size(labels, clusters)], metric, seed, resamples)
    return Interval(score(task, labels, predictions), low, high)


def paired(
    task: str,
    labels: np.ndarray,
    predictions: np.ndarray,
    reference: np.ndarray,
    seed: int = BOOTSTRAP_SEED,
    *,
    groups: np.ndarray | None = None,
    resamples: Resamples | None = None,
) -> Interval:
    """``score(predictions) - score(reference)`` on the same examples, with a 95%
    interval from resampling the examples (or, with ``groups``, whole clusters of
    them) once for both (a paired bootstrap)."""
    labels = np.asarray(labels, float)
    predictions, reference = np.asarray(predictions, float), np.asarray(reference, float)
    _check(task, labels, predictions, reference)
    clusters = _clusters(task, groups, len(labels))
    difference = _resampled(task, labels, predictions, clusters, reference=reference)
    low, high = _bootstrap([_size(labels, clusters)], difference, seed, resamples)
    return Interval(score(task, labels, predictions) - score(task, labels, reference), low, high)


def _part(part: Sequence, arrays: int) -> tuple[str, list[np.ndarray], _Clusters | None]:
    """(task, the part's float arrays, its clusters) of one part of an average: a
    task, ``arrays`` arrays of one value per example, and optionally cluster ids."""
    if len(part) not in (1 + arrays, 2 + arrays):
        raise ValueError(
            f"a part of an average holds a task, {arrays} arrays and optionally cluster ids; "
            f"got {len(part)} items"
        )
    task, *values = part
    groups = values.pop() if len(values) > arrays else None
    values = [np.asarray(v, float) for v in values]
    _check(task, *values)
    return task, values, _clusters(task, groups, len(values[0]))


def average_interval(
    parts: Sequence[tuple], seed: int = BOOTSTRAP_SEED, *, resamples: Resamples | None = None
) -> Interval:
    """The mean of several tasks' metrics, each task's examples resampled on their own;
    ``parts``: (task, labels, predictions[, groups])."""
    parts = [_part(part, 2) for part in parts]
    metrics = [_resampled(t, y, p, c) for t, (y, p), c in parts]

    def statistic(*drawn):
        return np.mean([metric(d) for metric, d in zip(metrics, drawn)], axis=0)

    low, high = _bootstrap([_size(y, c) for _, (y, _), c in parts], statistic, seed, resamples)
    return Interval(float(np.mean([score(t, y, p) for t, (y, p), _ in parts])), low, high)


def paired_average(
    parts: Sequence[tuple],
    seed: int = BOOTSTRAP_SEED,
    *,
    selection: bool = False,
    resamples: Resamples | None = None,
) -> Interval:
    """The difference of two models' averages (``selection``: of the selection metrics), each
    task paired on its examples; ``parts``: (task, labels, predictions, reference[, groups])."""
    parts = [_part(part, 3) for part in parts]
    differences = [_resampled(t, y, p, c, selection, reference=r) for t, (y, p, r), c in parts]

    def statistic(*drawn):
        return np.mean([difference(d) for difference, d in zip(differences, drawn)], axis=0)

    low, high = _bootstrap([_size(y, c) for _, (y, _, _), c in parts], statistic, seed, resamples)
    measure = selection_score if selection else score
    value = float(np.mean([measure(t, y, p) - measure(t, y, r) for t, (y, p, r), _ in parts]))
    return Interval(value, low, high)
