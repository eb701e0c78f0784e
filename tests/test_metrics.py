"""Task metrics, the written precision and the bootstrap intervals."""

import math

import numpy as np
import pytest
from scipy import stats

from minbert.metrics import (
    as_written,
    average_interval,
    fixed,
    interval,
    paired,
    paired_average,
    pearson,
    score,
    selection_score,
)
from minbert.pipeline.outputs import history_csv
from minbert.tasks import TASKS


def test_fixed_precision():
    assert fixed(0.123456) == 0.1235 and fixed(None) is None and math.isnan(fixed(float("nan")))
    assert str(fixed(-0.00001)) == "0.0"  # no "-0.0" in a file
    # Two machines that differ in the 7th decimal write the same number.
    assert fixed(0.17660817720573238) == fixed(0.17660812287271183)


def test_scores_and_written_predictions():
    assert score("sst", np.array([1, 2, 3]), np.array([1, 2, 0])) == pytest.approx(2 / 3)
    labels, preds = np.array([0.0, 1.0, 4.5, 3.0]), np.array([0.2, 1.5, 4.0, 2.5])
    assert score("sts", labels, preds) == pytest.approx(stats.pearsonr(labels, preds)[0])
    assert pearson(labels, np.ones(4)) == 0.0  # constant: no correlation
    assert as_written("sts", np.array([1.23456])).tolist() == [1.235]
    assert as_written("quora", np.array([1.0, 0.0])).dtype.kind == "i"


@pytest.mark.parametrize("task", sorted(TASKS))
def test_a_constant_answer_scores_zero_on_every_selection_metric(task):
    """What chooses epochs and learning rates cannot be won by a collapsed head: every
    constant answer scores 0, while on accuracy the majority answer scores its share
    (Quora's always-not-duplicate: 0.63 of the carved held-out pairs)."""
    rng = np.random.default_rng(0)
    spec = TASKS[task]
    if spec.label_kind == "class":
        labels = rng.choice(
            spec.num_classes, 500, p=np.r_[0.6, [0.4 / (spec.num_classes - 1)] * (spec.num_classes - 1)]
        )
        answers = range(spec.num_classes)
    else:
        labels = rng.uniform(*spec.score_range, 500)
        answers = [0.0, 2.5, 5.0]
    for answer in answers:
        constant = np.full(len(labels), answer)
        assert selection_score(task, labels, constant) == 0.0
    if spec.label_kind == "class":  # the control that accuracy fails
        assert score(task, labels, np.zeros(len(labels))) == pytest.approx(0.6, abs=0.05)
    assert selection_score(task, labels, labels) == pytest.approx(1.0)
    # Chance scores about 0 too.
    shuffled = rng.permutation(labels)
    assert abs(selection_score(task, labels, shuffled)) < 0.15


def test_interval_width_matches_the_binomial_standard_error():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 400)
    predictions = np.where(rng.random(400) < 0.5, labels, 1 - labels)
    iv = interval("quora", labels, predictions)
    assert iv.low < iv.value < iv.high
    se = math.sqrt(iv.value * (1 - iv.value) / 400)
    assert iv.high - iv.low == pytest.approx(2 * 1.96 * se, rel=0.15)
    assert interval("quora", labels, predictions) == iv  # seeded: the same every time


def test_pearson_interval_and_the_average():
    rng = np.random.default_rng(2)
    y = rng.uniform(0, 5, 300)
    p = y + rng.normal(0, 1.5, 300)
    iv = interval("sts", y, p)
    assert iv.low < iv.value < iv.high and iv.value == pytest.approx(stats.pearsonr(y, p)[0])
    c = rng.integers(0, 5, 200)
    both = average_interval([("sts", y, p), ("sst", c, c)])  # SST perfect: 1.0 in every resample
    assert both.value == pytest.approx((iv.value + 1.0) / 2)
    assert both.low == pytest.approx((iv.low + 1.0) / 2, abs=0.01)


def test_paired_difference():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, 500)
    a = np.where(rng.random(500) < 0.6, labels, (labels + 1) % 5)
    same = paired("sst", labels, a, a)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0) and not same.excludes_zero
    better = np.where(rng.random(500) < 0.5, labels, a)  # strictly more correct answers
    gain = paired("sst", labels, better, a)
    assert gain.value > 0 and gain.excludes_zero
    y = rng.uniform(0, 5, 100)
    avg = paired_average([("sst", labels, better, a), ("sts", y, y + 1, y + 1)])
    assert avg.value == pytest.approx(gain.value / 2)
    with pytest.raises(ValueError, match="sst: 500 labels but 3 predictions"):
        paired("sst", labels, a[:3], a)


def test_history_csv_orders_columns_by_the_fullest_row():
    text = history_csv(
        [
            {"epoch": 0, "dev_average": 0.25},
            {"epoch": 1, "lr": 0.1, "train_loss_sst": 1.5, "dev_average": 0.5},
        ]
    )
    assert text.splitlines() == ["epoch,lr,train_loss_sst,dev_average", "0,,,0.25", "1,0.1,1.5,0.5"]


@pytest.mark.parametrize("task", ["sst", "quora"])
def test_the_resampled_selection_metric_is_mcc_on_the_drawn_examples(task):
    """The bootstrap of the chance-corrected score (what ranks configurations) recomputes
    Matthews' correlation from each resample's counts, also when whole clusters are drawn."""
    from minbert.metrics import Drawn, _clusters, _resampled, mcc

    rng = np.random.default_rng(0)
    k = TASKS[task].num_classes
    labels = rng.integers(0, k, 300).astype(float)
    predictions = np.where(rng.random(300) < 0.6, labels, rng.integers(0, k, 300)).astype(float)
    drawn = rng.integers(0, 300, (4, 300))
    resampled = _resampled(task, labels, predictions, selection=True)(Drawn(drawn))
    assert resampled == pytest.approx([mcc(labels[i], predictions[i]) for i in drawn], abs=1e-12)
    clusters = _clusters(task, rng.integers(0, 60, 300), 300)
    units = rng.integers(0, len(clusters), (3, len(clusters)))
    by_cluster = _resampled(task, labels, predictions, clusters, selection=True)(Drawn(units))
    for value, row in zip(by_cluster, units):
        rows = np.concatenate([np.flatnonzero(clusters.index == u) for u in row])
        assert value == pytest.approx(mcc(labels[rows], predictions[rows]), abs=1e-12)
    # Paired: a model against itself differs by exactly zero.
    same = paired_average([(task, labels, predictions, predictions)], selection=True)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("task", ["sst", "quora", "sts"])
@pytest.mark.parametrize("selection", [False, True])
def test_a_resampled_difference_is_the_two_models_scored_on_the_same_draws(task, selection):
    """A paired difference scores each model on every resample (accuracy, MCC or Pearson's
    r recomputed per draw), also when both were scored on the batch before, with these
    labels or others."""
    from minbert.metrics import Drawn, _resampled

    rng = np.random.default_rng(3)
    if task == "sts":
        labels = rng.uniform(0, 5, 200).round(1)
        first, second = (np.round(labels + rng.normal(0, s, 200), 3) for s in (1.0, 2.0))
    else:
        labels = rng.integers(0, TASKS[task].num_classes, 200).astype(float)
        first, second = (np.where(rng.random(200) < q, labels, 0.0) for q in (0.7, 0.4))
    drawn = Drawn(rng.integers(0, 200, (5, 200), dtype=np.int32))
    measure = selection_score if selection else score
    # The second time from what the batch remembers; other labels on the same draws.
    for y in (labels, labels, labels[::-1].copy()):
        for a, b in [(first, second), (second, first)]:
            difference = _resampled(task, y, a, selection=selection, reference=b)(drawn)
            expected = [measure(task, y[i], a[i]) - measure(task, y[i], b[i]) for i in drawn.indices]
            assert difference == pytest.approx(expected, abs=1e-12)


def test_the_bootstrap_is_scipys_percentile_bootstrap_draw_for_draw():
    """The draws are made here (int32, no gather of arange), but the interval is
    scipy.stats.bootstrap's to the bit, for one sample and for several of unequal size."""
    from minbert.metrics import BOOTSTRAP_RESAMPLES, CONFIDENCE, _bootstrap

    values = {n: np.random.default_rng(n).normal(size=n) for n in (37, 300)}

    def mean_of(*idx, axis=-1):  # scipy hands over arange(n) resampled, i.e. the indices
        idx = [getattr(i, "indices", i) for i in idx]  # here: the Drawn batches
        return np.mean([values[i.shape[-1]][i].mean(axis=-1) for i in idx], axis=0)

    for sizes in [(300,), (37, 300)]:
        reference = stats.bootstrap(
            tuple(np.arange(n) for n in sizes),
            mean_of,
            n_resamples=BOOTSTRAP_RESAMPLES,
            vectorized=True,
            confidence_level=CONFIDENCE,
            method="percentile",
            batch=500,
            rng=np.random.default_rng(5),
        ).confidence_interval
        assert _bootstrap(sizes, mean_of, 5) == (reference.low, reference.high)
    assert _bootstrap((300,), mean_of, 6) != _bootstrap((300,), mean_of, 5)


def test_drawn_counts_are_the_drawn_units_summed():
    """A batch's counts of each unit, times the units, give the sum of the drawn units
    exactly, for examples and for clusters."""
    from minbert.metrics import Drawn, _clusters, _per_unit

    rng = np.random.default_rng(4)
    examples = rng.integers(0, 2, (500, 6)).astype(float)
    clusters = _per_unit(examples, _clusters("quora", rng.integers(0, 120, 500), 500))
    for units in (examples, clusters):
        drawn = rng.integers(0, len(units), (7, len(units)), dtype=np.int32)
        assert np.array_equal(Drawn(drawn).counts @ units, units[drawn].sum(axis=-2))


def test_shared_resamples_give_every_interval_its_own_bootstrap_to_the_bit():
    """Bootstraps that share their draws and what was scored on them (the report's) give
    each interval exactly what its own fresh draws give, whatever was computed before it."""
    from minbert.metrics import Resamples

    rng = np.random.default_rng(8)
    runs = {}
    for task, n, groups in [("sst", 120, None), ("quora", 150, rng.integers(0, 40, 150)), ("sts", 90, None)]:
        if task == "sts":
            labels = rng.uniform(0, 5, n).round(1)
            answers = [np.round(labels + rng.normal(0, s, n), 3) for s in (1.0, 2.0, 1.0)]
        else:
            labels = rng.integers(0, TASKS[task].num_classes, n).astype(float)
            answers = [np.where(rng.random(n) < q, labels, 0.0) for q in (0.5, 0.7, 0.5)]
        runs[task] = (labels, answers, groups)

    def intervals(resamples):
        out = []
        for task, (labels, (a, b, c), groups) in runs.items():
            out.append(interval(task, labels, a, groups=groups, resamples=resamples))
            pairs = [(a, b), (b, c)]
            out += [paired(task, labels, x, y, groups=groups, resamples=resamples) for x, y in pairs]
        for answer, reference in [(0, 1), (1, 2)]:
            parts = [(t, y, p[answer], p[reference], g) for t, (y, p, g) in runs.items()]
            out.append(paired_average(parts, selection=True, resamples=resamples))
        out.append(average_interval([(t, y, p[0], g) for t, (y, p, g) in runs.items()], resamples=resamples))
        return out

    shared = Resamples()
    assert intervals(shared) == intervals(None) == intervals(shared)
