"""The validation split: rows of a training split set aside to choose the epoch and the
learning rates on, so that dev is scored once and never chooses (docs/method.md); whole
question groups where a table has them, each label its share."""

from __future__ import annotations

import numpy as np

from minbert.data.batches import TokenizedTable, subsample
from minbert.data.quora_split import holdout_mask
from minbert.data.strata import label_strata


def carve_validation(table: TokenizedTable, n: int, seed: int) -> tuple[TokenizedTable, TokenizedTable]:
    """(the rows left for training, about ``n`` validation rows) of ``table``, by a seeded
    hash of the ids (``holdout_mask``): the same in any row order."""
    if n < 1:
        raise ValueError(f"a validation split needs at least 1 row, got {n}")
    if n >= len(table):
        raise ValueError(
            f"{n} validation rows asked of a training split of {len(table)}: "
            "nothing would be left to train on"
        )
    strata = None if table.labels is None else label_strata(table.labels)
    held = holdout_mask(table.ids, n / len(table), seed, table.groups, strata)
    return table.subset(np.flatnonzero(~held)), table.subset(np.flatnonzero(held))


def run_rows(
    table: TokenizedTable, validation_examples: int, train_examples: int, seed: int
) -> tuple[TokenizedTable, TokenizedTable]:
    """(the training rows, the validation rows) a run of ``seed`` takes from a training
    split: the validation split carved out, ``train_examples`` drawn from the rest (0: all)."""
    rest, validation = carve_validation(table, validation_examples, seed)
    return subsample(rest, train_examples, seed), validation
