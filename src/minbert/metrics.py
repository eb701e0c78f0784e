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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


def _summing(units: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``idx -> units[idx].sum(axis=-2)`` for rows of drawn indices. An example's counts
    take few distinct values, so a draw is counted per distinct unit (a bincount over few
    bins) and the counts multiplied by the distinct units: the same numbers exactly, as
    integer counts are exact in float64."""
    distinct, kind = np.unique(units, axis=0, return_inverse=True)
    kind = kind.reshape(-1).astype(np.intp)

    def sums(idx: np.ndarray) -> np.ndarray:
        draws = kind[np.reshape(idx, (-1, np.shape(idx)[-1]))]
        times = np.empty((len(draws), len(distinct)))
        for row, drawn in zip(times, draws):  # a draw at a time: a cache-sized bincount
            row[:] = np.bincount(drawn, minlength=len(distinct))
        return (times @ distinct).reshape(*np.shape(idx)[:-1], units.shape[1])

    return sums


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


def _resampled(
    task: str,
    labels: np.ndarray,
    predictions: np.ndarray,
    clusters: _Clusters | None = None,
    selection: bool = False,
    reference: np.ndarray | None = None,
):
    """The metric (``selection``: the selection metric) on each row of resampled indices of
    examples, or of ``clusters``, minus the reference's on the same draws when ``reference``
    is given: accuracy and MCC from the drawn units' counts (both models' in one pass),
    Pearson's r recomputed (no clustered form)."""
    spec = TASKS[task]
    metric = spec.selection_metric if selection else spec.metric
    models = [predictions] if reference is None else [predictions, reference]
    if metric in ("accuracy", "mcc"):
        columns = [_count_columns(task, metric, labels, p) for p in models]
        summed = _summing(_per_unit(np.concatenate(columns, axis=1), clusters))
        width = columns[0].shape[1]

        def counted(idx):
            sums = summed(idx)  # (..., columns): the drawn units' counts
            values = [
                _from_counts(task, metric, sums[..., m * width : (m + 1) * width]) for m in range(len(models))
            ]
            return values[0] if reference is None else values[0] - values[1]

        return counted
    if clusters is not None:
        raise ValueError(
            f"{task}: Pearson's r has no cluster bootstrap here (STS pairs are not grouped); "
            "leave out its cluster ids"
        )

    def r(idx):
        x = _centered(labels[idx])  # once for both models
        x_squares = (x * x).sum(axis=-1)
        values = [_pearson_rows(x, x_squares, _centered(p[idx])) for p in models]
        return values[0] if reference is None else values[0] - values[1]

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


def _bootstrap(sizes: Sequence[int], statistic, seed: int) -> tuple[float, float]:
    """scipy.stats.bootstrap's percentile interval (vectorized, batches of 500) of
    ``statistic(*idx)``, ``idx`` the drawn indices of units 0..n-1 of each size. Drawn
    here from the same stream, the same values: int32 (numpy draws the same numbers for
    int32 and int64 below 2**32, with half the bytes) and no gather of ``arange(n)``."""
    rng = np.random.default_rng(seed)
    values = []
    for start in range(0, BOOTSTRAP_RESAMPLES, _BATCH):
        rows = min(_BATCH, BOOTSTRAP_RESAMPLES - start)
        values.append(statistic(*[rng.integers(0, n, (rows, n), dtype=np.int32) for n in sizes]))
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
) -> Interval:
    """The metric with a 95% percentile-bootstrap interval over the examples, or over
    whole clusters of them when ``groups`` (one cluster id per example) is given."""
    labels, predictions = np.asarray(labels, float), np.asarray(predictions, float)
    _check(task, labels, predictions)
    clusters = _clusters(task, groups, len(labels))
    metric = _resampled(task, labels, predictions, clusters)
    low, high = _bootstrap([_size(labels, clusters)], metric, seed)
    return Interval(score(task, labels, predictions), low, high)


def paired(
    task: str,
    labels: np.ndarray,
    predictions: np.ndarray,
    reference: np.ndarray,
    seed: int = BOOTSTRAP_SEED,
    *,
    groups: np.ndarray | None = None,
) -> Interval:
    """``score(predictions) - score(reference)`` on the same examples, with a 95%
    interval from resampling the examples (or, with ``groups``, whole clusters of
    them) once for both (a paired bootstrap)."""
    labels = np.asarray(labels, float)
    predictions, reference = np.asarray(predictions, float), np.asarray(reference, float)
    _check(task, labels, predictions, reference)
    clusters = _clusters(task, groups, len(labels))
    difference = _resampled(task, labels, predictions, clusters, reference=reference)
    low, high = _bootstrap([_size(labels, clusters)], difference, seed)
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


def average_interval(parts: Sequence[tuple], seed: int = BOOTSTRAP_SEED) -> Interval:
    """The mean of several tasks' metrics, each task's examples resampled on their own;
    ``parts``: (task, labels, predictions[, groups])."""
    parts = [_part(part, 2) for part in parts]
    metrics = [_resampled(t, y, p, c) for t, (y, p), c in parts]

    def statistic(*indices):
        return np.mean([metric(i) for metric, i in zip(metrics, indices)], axis=0)

    low, high = _bootstrap([_size(y, c) for _, (y, _), c in parts], statistic, seed)
    return Interval(float(np.mean([score(t, y, p) for t, (y, p), _ in parts])), low, high)


def paired_average(
    parts: Sequence[tuple], seed: int = BOOTSTRAP_SEED, *, selection: bool = False
) -> Interval:
    """The difference of two models' averages (``selection``: of the selection metrics), each
    task paired on its examples; ``parts``: (task, labels, predictions, reference[, groups])."""
    parts = [_part(part, 3) for part in parts]
    differences = [_resampled(t, y, p, c, selection, reference=r) for t, (y, p, r), c in parts]

    def statistic(*indices):
        return np.mean([difference(i) for difference, i in zip(differences, indices)], axis=0)

    low, high = _bootstrap([_size(y, c) for _, (y, _, _), c in parts], statistic, seed)
    measure = selection_score if selection else score
    value = float(np.mean([measure(t, y, p) - measure(t, y, r) for t, (y, p, r), _ in parts]))
    return Interval(value, low, high)
