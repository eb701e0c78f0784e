"""The validation split: training rows set aside to choose the epoch and the learning rates.

The course's test labels are not public, so the dev sets are the only labelled data
the tables can report. Choosing the best epoch, or a learning rate, on the dev
examples a table then reports flatters that table; so every training run first sets
aside ``n`` rows of its *training* split as a validation split, chooses on those,
and scores dev once. The training rows are then drawn from what remains, so no
validation row is ever trained on.

Where a table carries question groups (the carved Quora split, see
``minbert.data.quora_split``), whole groups are set aside, so no question of a
validation pair appears in a training pair. Each label gives its share of the rows
(``minbert.data.strata``), so the split's label distribution is the training split's.
"""

from __future__ import annotations

import numpy as np

from minbert.data.batches import TokenizedTable
from minbert.data.quora_split import holdout_mask
from minbert.data.strata import label_strata


def carve_validation(table: TokenizedTable, n: int, seed: int) -> tuple[TokenizedTable, TokenizedTable]:
    """(the rows left for training, about ``n`` validation rows) of ``table``.

    The rows are chosen by a seeded hash of their ids (``holdout_mask``): the same
    ids and seed give the same split in any row order. Each label stratum gives its
    share; with groups, whole groups are taken until at least that many rows are.
    """
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
