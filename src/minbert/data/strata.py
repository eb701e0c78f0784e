"""Label strata: every subset the runs draw (``subsample``, ``carve_validation``) takes
from each label its share of the rows (why: docs/method.md)."""

from __future__ import annotations

import numpy as np


def label_strata(labels: np.ndarray) -> np.ndarray:
    """Each row's stratum: its class, or for a score (STS, 0-5) the nearest integer."""
    return np.rint(np.asarray(labels, dtype=float)).astype(np.int64)


def quotas(sizes: dict[int, int], n: int) -> dict[int, int]:
    """``n`` split over strata in proportion to ``sizes`` (largest remainder; ties by
    stratum), never more than a stratum holds."""
    total = sum(sizes.values())
    exact = {s: n * size / total for s, size in sizes.items()}
    out = {s: int(np.floor(e)) for s, e in exact.items()}
    for s in sorted(sizes, key=lambda s: (out[s] - exact[s], s))[: n - sum(out.values())]:
        out[s] += 1
    return {s: min(q, sizes[s]) for s, q in out.items()}


def stratified_choice(strata: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` row numbers drawn without replacement, each stratum's share from it (sorted)."""
    values, counts = np.unique(strata, return_counts=True)
    wanted = quotas(dict(zip(values.tolist(), counts.tolist())), n)
    rows = [rng.choice(np.flatnonzero(strata == s), size=q, replace=False) for s, q in wanted.items()]
    return np.sort(np.concatenate(rows))
