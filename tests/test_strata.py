"""Subsets that keep the label distribution: the validation split and the training
subset take each label's share of the rows (minbert.data.strata)."""

from __future__ import annotations

import numpy as np
import pytest

from minbert.data.batches import Sequences, TokenizedTable, subsample
from minbert.data.strata import label_strata, quotas
from minbert.data.validation_split import carve_validation


def _table(labels, groups=None) -> TokenizedTable:
    n = len(labels)
    tokens = Sequences.from_list([np.array([101, 7 + i % 50, 102]) for i in range(n)])
    return TokenizedTable(
        [f"row{i:05d}" for i in range(n)], np.asarray(labels), {"input_ids": tokens}, groups
    )


def _shares(labels) -> np.ndarray:
    strata = label_strata(labels)
    return np.array([np.mean(strata == s) for s in range(strata.max() + 1)])


def test_quotas_add_up_and_follow_the_sizes():
    assert quotas({0: 10, 1: 30, 2: 60}, 10) == {0: 1, 1: 3, 2: 6}
    out = quotas({0: 1, 1: 1, 2: 1}, 2)
    assert sum(out.values()) == 2 and max(out.values()) == 1
    assert quotas({0: 2, 1: 98}, 50)[0] == 1


def test_a_skewed_draw_is_not_possible_any_more():
    """A seeded plain draw of 200 of these rows puts up to a third more of one class in;
    the stratified split and subset keep every class within one row of its share."""
    rng = np.random.default_rng(0)
    labels = rng.choice(5, size=8000, p=[0.13, 0.26, 0.19, 0.27, 0.15])
    table = _table(labels)
    for seed in range(5):
        rest, validation = carve_validation(table, 200, seed)
        train = subsample(rest, 192, seed)
        assert len(validation) == 200 and len(train) == 192
        assert not set(validation.ids) & set(rest.ids)
        assert np.abs(_shares(validation.labels) - _shares(labels)).max() <= 1 / 200
        assert np.abs(_shares(train.labels) - _shares(rest.labels)).max() <= 1 / 192


def test_scores_are_stratified_by_their_nearest_integer():
    labels = np.repeat(np.linspace(0, 5, 11), 100)  # 0, 0.5, ..., 5
    _, validation = carve_validation(_table(labels), 110, 1)
    assert (np.bincount(label_strata(validation.labels)) * 10 == np.bincount(label_strata(labels))).all()


@pytest.mark.parametrize("seed", [0, 3])
def test_groups_stay_whole_and_each_label_gives_its_share(seed):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(3000), rng.choice([1, 1, 1, 2, 3], size=3000))
    labels = rng.choice(2, size=len(groups), p=[0.62, 0.38])
    rest, validation = carve_validation(_table(labels, groups), 300, seed)
    assert not set(validation.groups) & set(rest.groups)
    assert abs(len(validation) - 300) <= 6
    assert abs(np.mean(validation.labels) - np.mean(labels)) < 0.03


def test_unlabelled_rows_are_drawn_plainly():
    table = TokenizedTable([f"r{i}" for i in range(50)], None, _table(np.zeros(50)).sequences)
    assert len(subsample(table, 10, 0)) == 10
