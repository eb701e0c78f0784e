"""Quora's train and held-out parts, carved out of the labelled quora-dev.csv.

Offline, the course's 141k Quora train split is missing, so the pipeline splits the
20k labelled dev pairs itself. Questions repeat across pairs, so a split by pair
would let a held-out pair share a question with a training pair; pairs that share a
question (directly or through a chain of pairs) therefore stay on one side.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd


def normalise_question(text: str) -> str:
    """A question as the Quora split compares it: whitespace collapsed, lower case."""
    return " ".join(str(text).split()).lower()


def question_groups(first: Sequence[str], second: Sequence[str]) -> np.ndarray:
    """Group number of each pair: two pairs belong to one group when they share a
    question (after ``normalise_question``), directly or through a chain of pairs.

    Union-find over the questions; groups are numbered in order of first appearance.
    """
    parent: dict[str, str] = {}

    def root(q: str) -> str:
        parent.setdefault(q, q)
        while parent[q] != q:
            parent[q] = parent[parent[q]]  # path halving
            q = parent[q]
        return q

    pairs = [(normalise_question(a), normalise_question(b)) for a, b in zip(first, second, strict=True)]
    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
    numbers: dict[str, int] = {}
    return np.array([numbers.setdefault(root(a), len(numbers)) for a, _ in pairs], dtype=np.int64)


def holdout_mask(
    ids: Iterable[str], fraction: float, seed: int, groups: Sequence[int] | None = None
) -> np.ndarray:
    """Boolean mask (True = held out) assigning about `fraction` of `ids` to a held-out
    part, whole groups at a time.

    Each group (each id on its own when ``groups`` is None) is ranked by the smallest
    sha256 of (seed, id) among its members, and groups are held out in rank order
    until ``round(len * fraction)`` ids are: exactly that many when every group has
    one member, else at most one group more. The result depends only on the ids,
    their grouping, the fraction and the seed: not on row order, Python's hash
    randomisation or library versions. Both parts keep at least one group.
    """
    ids = list(ids)
    if len(ids) < 2:
        raise ValueError(f"need at least 2 ids to split, got {len(ids)}")
    if not 0 < fraction < 1:
        raise ValueError(f"holdout fraction must be strictly between 0 and 1, got {fraction}")
    groups = np.arange(len(ids)) if groups is None else np.asarray(groups)
    if len(groups) != len(ids):
        raise ValueError(f"{len(ids)} ids but {len(groups)} group numbers")
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups.tolist()):
        members.setdefault(g, []).append(i)
    if len(members) < 2:
        raise ValueError("every id is in one group: nothing can be held out without it")
    rank = {
        g: min((hashlib.sha256(f"{seed}\0{ids[i]}".encode()).digest(), ids[i]) for i in rows)
        for g, rows in members.items()
    }
    target = min(max(round(len(ids) * fraction), 1), len(ids) - 1)
    mask = np.zeros(len(ids), dtype=bool)
    ranked = sorted(members, key=rank.__getitem__)
    for g in ranked[:-1]:  # the last group always stays in training
        if mask.sum() >= target:
            break
        mask[members[g]] = True
    return mask


def carve_quora(
    frames: dict[tuple[str, str], pd.DataFrame],
    origin: dict[tuple[str, str], str],
    fraction: float,
    seed: int,
) -> dict:
    """Replace the Quora dev table by a train part and a held-out dev part of it,
    holding out whole groups of pairs that share a question (``question_groups``)."""
    dev = frames.pop(("quora", "dev"))
    name = origin.pop(("quora", "dev"))
    groups = question_groups(dev["sentence1"], dev["sentence2"])
    held = holdout_mask(dev["id"], fraction, seed, groups)
    train_part, held_part = dev[~held].reset_index(drop=True), dev[held].reset_index(drop=True)

    def questions(frame: pd.DataFrame) -> set[str]:
        return {normalise_question(q) for column in ("sentence1", "sentence2") for q in frame[column]}

    crossing = len(questions(train_part) & questions(held_part))
    if crossing:  # cannot happen with whole groups; checked all the same
        raise RuntimeError(f"{name}: {crossing} questions appear on both sides of the carved split")
    frames["quora", "train"], frames["quora", "dev"] = train_part, held_part
    origin["quora", "train"] = origin["quora", "dev"] = name
    n_train, n_held = len(train_part), len(held_part)
    sizes = np.bincount(groups)
    return {
        "kind": "carved-from-dev",
        "holdout_fraction": fraction,
        "seed": seed,
        "train_pairs": n_train,
        "heldout_pairs": n_held,
        "question_groups": int(len(sizes)),
        "largest_group_pairs": int(sizes.max()),
        "questions_across_split": crossing,
        "note": (
            "Quora's official 141k train split was not available; train and dev here are both carved "
            f"out of the course's labelled {name} ({len(dev)} usable pairs). Pairs that share a "
            "question (after whitespace and case normalisation), directly or through a chain of "
            f"pairs, form one group ({len(sizes)} groups); whole groups, chosen by a seeded sha256 "
            f"hash, are held out as dev ({n_held} pairs) and the rest are used for training "
            f"({n_train} pairs), so no question appears on both sides. Quora results from this "
            "data are measured on that held-out part and are not comparable with results on the "
            "official Quora dev set."
        ),
    }
