"""The cluster bootstrap: intervals that resample whole groups of examples (Quora's
question groups), in ``minbert.metrics`` and in the report's evidence."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from minbert.data.predictions import write_predictions
from minbert.metrics import (
    average_interval,
    fixed,
    interval,
    paired,
    paired_average,
    score,
)
from minbert.report.evidence import Evidence


def clustered(n_clusters: int, seed: int, within: float = 1.0):
    """Labels, predictions and cluster ids where a cluster's examples tend to be right
    or wrong together: each cluster (1 to 9 examples) is right with probability 0.7,
    and each of its examples follows the cluster with probability ``within`` (else
    it is right or wrong at random)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 10, n_clusters)
    groups = np.repeat(np.arange(n_clusters), sizes)
    cluster_right = rng.random(n_clusters) < 0.7
    follows = rng.random(len(groups)) < within
    right = np.where(follows, cluster_right[groups], rng.random(len(groups)) < 0.5)
    labels = rng.integers(0, 2, len(groups))
    predictions = np.where(right, labels, 1 - labels)
    return labels, predictions, groups


def hand_cluster_bootstrap(labels, predictions, groups, resamples=20_000, seed=7):
    """A plain numpy cluster bootstrap of accuracy: (2.5th, 97.5th percentile, standard
    error) of sum(correct) / sum(examples) over clusters drawn with replacement."""
    ids = np.unique(groups)
    hits = np.array([(labels == predictions)[groups == g].sum() for g in ids], float)
    sizes = np.array([(groups == g).sum() for g in ids], float)
    draws = np.random.default_rng(seed).integers(0, len(ids), (resamples, len(ids)))
    accuracy = hits[draws].sum(axis=1) / sizes[draws].sum(axis=1)
    low, high = np.percentile(accuracy, [2.5, 97.5])
    return low, high, accuracy.std()


def test_the_interval_matches_a_hand_computed_cluster_bootstrap():
    """Different generators, so not the same draws: the endpoints agree within a few
    Monte Carlo errors (about 0.001 each with 10k and 20k resamples at a standard error
    of 0.03), and the width is about 2 x 1.96 standard errors."""
    labels, predictions, groups = clustered(300, seed=0)
    iv = interval("quora", labels, predictions, groups=groups)
    low, high, se = hand_cluster_bootstrap(labels, predictions, groups)
    assert iv.value == pytest.approx((labels == predictions).mean())
    assert iv.low == pytest.approx(low, abs=0.005) and iv.high == pytest.approx(high, abs=0.005)
    assert iv.high - iv.low == pytest.approx(2 * 1.96 * se, rel=0.1)


def test_correlated_clusters_widen_the_interval():
    """Whole clusters right or wrong together: a cluster's examples carry the
    information of one, so the honest interval is wider by about the square root of
    sum(size^2) / sum(size), 2.5 for sizes 1 to 9."""
    labels, predictions, groups = clustered(300, seed=1)
    pairs = interval("quora", labels, predictions)
    clusters = interval("quora", labels, predictions, groups=groups)
    assert clusters.value == pairs.value
    assert clusters.high - clusters.low > 1.6 * (pairs.high - pairs.low)
    # Examples independent of their cluster: no wider than resampling examples.
    labels, predictions, groups = clustered(300, seed=1, within=0.0)
    pairs = interval("quora", labels, predictions)
    clusters = interval("quora", labels, predictions, groups=groups)
    assert clusters.high - clusters.low == pytest.approx(pairs.high - pairs.low, rel=0.15)


@pytest.mark.slow
def test_singleton_clusters_reproduce_the_example_bootstrap():
    labels, predictions, _ = clustered(400, seed=2)
    plain = interval("quora", labels, predictions)
    # Numbered in example order: the same draws, so the same numbers.
    assert interval("quora", labels, predictions, groups=np.arange(len(labels))) == plain
    # Any other one-per-example ids: other draws of the same bootstrap.
    shuffled = np.random.default_rng(0).permutation(len(labels)).astype(str)
    other = interval("quora", labels, predictions, groups=shuffled)
    assert other.low == pytest.approx(plain.low, abs=0.006)
    assert other.high == pytest.approx(plain.high, abs=0.006)


@pytest.mark.slow
def test_paired_differences_resample_clusters_for_both_models():
    labels, predictions, groups = clustered(300, seed=3)
    # A second model, right on whole clusters where the first is wrong (and vice versa).
    flip = np.random.default_rng(4).random(groups.max() + 1) < 0.3
    reference = np.where(flip[groups], 1 - predictions, predictions)
    pairs = paired("quora", labels, predictions, reference)
    clusters = paired("quora", labels, predictions, reference, groups=groups)
    assert clusters.value == pairs.value
    assert clusters.high - clusters.low > 1.6 * (pairs.high - pairs.low)
    same = paired("quora", labels, predictions, predictions, groups=groups)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)


def test_averages_take_cluster_ids_per_part():
    labels, predictions, groups = clustered(300, seed=5)
    rng = np.random.default_rng(6)
    y = rng.uniform(0, 5, 200)
    p = y + rng.normal(0, 1, 200)
    quora = interval("quora", labels, predictions, groups=groups)
    # A part without cluster ids, or with None, is the part as before.
    assert average_interval([("sts", y, p, None), ("quora", labels, predictions)]) == average_interval(
        [("sts", y, p), ("quora", labels, predictions)]
    )
    sts_perfect = average_interval([("sts", y, y), ("quora", labels, predictions, groups)])
    assert sts_perfect.value == pytest.approx((1 + quora.value) / 2)
    assert sts_perfect.high - sts_perfect.low == pytest.approx((quora.high - quora.low) / 2, rel=0.1)
    by_example = average_interval([("sts", y, y), ("quora", labels, predictions)])
    assert sts_perfect.high - sts_perfect.low > 1.6 * (by_example.high - by_example.low)

    reference = np.where(np.random.default_rng(7).random(len(labels)) < 0.2, 1 - predictions, predictions)
    clustered_difference = paired("quora", labels, predictions, reference, groups=groups)
    both = paired_average([("sts", y, p, p), ("quora", labels, predictions, reference, groups)])
    assert both.value == pytest.approx(clustered_difference.value / 2)
    assert both.high - both.low == pytest.approx(
        (clustered_difference.high - clustered_difference.low) / 2, rel=0.1
    )
    by_example = paired_average([("sts", y, p, p), ("quora", labels, predictions, reference)])
    assert both.high - both.low > 1.25 * (by_example.high - by_example.low)


def test_mistakes_are_named():
    labels, predictions, groups = clustered(50, seed=8)
    with pytest.raises(ValueError, match=r"sts: Pearson's r has no cluster bootstrap"):
        interval("sts", labels.astype(float), predictions.astype(float), groups=groups)
    with pytest.raises(ValueError, match=rf"quora: {len(labels)} labels but 3 cluster ids"):
        interval("quora", labels, predictions, groups=groups[:3])
    with pytest.raises(ValueError, match="at least 2 clusters, got 1"):
        paired("quora", labels, predictions, predictions, groups=np.zeros(len(labels)))
    with pytest.raises(ValueError, match="a task, 2 arrays and optionally cluster ids; got 6 items"):
        average_interval([("quora", labels, predictions, groups, groups, groups)])


@pytest.mark.slow
def test_the_report_resamples_quora_by_its_group_column(tmp_path):
    """The evidence joins predictions to the prepared dev table by id (whatever the
    predictions' order) and hands the table's ``group`` column to every Quora interval."""
    labels, predictions, groups = clustered(200, seed=9)
    ids = [f"q{i}" for i in range(len(labels))]
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    pd.DataFrame({"id": ids, "label": labels, "group": groups}).to_parquet(prepared / "quora-dev.parquet")
    pd.DataFrame({"id": ids, "label": labels}).to_parquet(prepared / "sst-dev.parquet")
    order = np.random.default_rng(0).permutation(len(ids))
    for name, guess in (("ours", predictions), ("parent", 1 - predictions)):
        for task in ("quora", "sst"):
            write_predictions(
                tmp_path / "predictions" / name / f"{task}-dev-out.csv",
                task,
                [ids[i] for i in order],
                guess[order],
            )
    evidence = Evidence(tmp_path / "predictions", prepared)

    def scored(name, guess):
        files = {t: f"{name}/{t}-dev-out.csv" for t in ("quora", "sst")}
        return evidence.scored(name, files, {t: fixed(score(t, labels, guess)) for t in files})

    ours, parent = scored("ours", predictions), scored("parent", 1 - predictions)
    quora = evidence.cell(ours, "quora")
    assert quora == interval("quora", labels, predictions, groups=groups)
    by_example = interval("quora", labels, predictions)
    assert quora.high - quora.low > 1.6 * (by_example.high - by_example.low)
    assert evidence.cell(ours, "sst") == interval("sst", labels, predictions)  # no group column
    assert evidence.difference(ours, parent, "quora") == paired(
        "quora", labels, predictions, 1 - predictions, groups=groups
    )
    assert evidence.average(ours) == average_interval(
        [("quora", labels, predictions, groups), ("sst", labels, predictions)]
    )
    assert evidence.average_difference(ours, parent) == paired_average(
        [
            ("quora", labels, predictions, 1 - predictions, groups),
            ("sst", labels, predictions, 1 - predictions),
        ]
    )
