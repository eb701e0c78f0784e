"""Length-bucketed batching and padding."""

import numpy as np
import pytest

from minbert.data.batches import (
    Sequences,
    length_bucketed_batches,
    pad,
    random_batches,
    split_by_tokens,
)


def test_every_row_exactly_once_and_buckets_are_tight():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 200, size=1000)
    batches = length_bucketed_batches(lengths, 16, shuffle=True, generator=np.random.default_rng(1))
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(1000))
    padded = sum(len(b) * lengths[b].max() for b in batches)
    plain = sum(len(b) * lengths[b].max() for b in random_batches(1000, 16, np.random.default_rng(1)))
    assert padded < 0.7 * plain  # bucketing removes most of the padding
    assert padded >= lengths.sum()


def test_shuffled_batches_change_between_epochs_but_are_seeded():
    lengths = np.arange(100) % 17 + 1
    gen = np.random.default_rng(5)
    first = length_bucketed_batches(lengths, 8, shuffle=True, generator=gen)
    second = length_bucketed_batches(lengths, 8, shuffle=True, generator=gen)
    assert [b.tolist() for b in first] != [b.tolist() for b in second]
    again = length_bucketed_batches(lengths, 8, shuffle=True, generator=np.random.default_rng(5))
    assert [b.tolist() for b in first] == [b.tolist() for b in again]


def test_evaluation_batches_are_sorted_by_length():
    lengths = np.array([5, 1, 3, 2, 4])
    batches = length_bucketed_batches(lengths, 2, shuffle=False)
    assert [b.tolist() for b in batches] == [[1, 3], [2, 4], [0]]
    with pytest.raises(ValueError):
        length_bucketed_batches(lengths, 2, shuffle=True)


def test_pad_to_longest_of_batch():
    seqs = Sequences.from_list([np.array([101, 7, 102]), np.array([101, 102]), np.array([101, 1, 2, 3, 102])])
    ids, mask = pad(seqs, np.array([0, 1]))
    assert ids.tolist() == [[101, 7, 102], [101, 102, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert seqs[2].tolist() == [101, 1, 2, 3, 102]


def test_split_by_tokens_keeps_rows_in_order_under_the_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=200)
    rows = rng.permutation(200)[:32]
    for budget in (0, 1, 50, 100, 10_000):
        pieces = split_by_tokens(rows, lengths, budget)
        assert np.array_equal(np.concatenate(pieces), rows)
        for piece in pieces:
            cost = len(piece) * lengths[piece].max()
            assert budget == 0 or cost <= budget or len(piece) == 1
    assert len(split_by_tokens(rows, lengths, 0)) == 1
