"""Quora's train and held-out parts, carved out of the labelled quora-dev.csv (the course's
141k train split is missing offline). Pairs that share a question, directly or through a
chain, stay on one side; each group is drawn by one seeded hash, so a large group (mostly
duplicates on Quora) is no likelier to be held out than a single pair. Every part keeps
the ``group`` column, so a bootstrap can resample whole groups."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from minbert.data.strata import quotas


def normalise_question(text: str) -> str:
    """A question as the Quora split compares it: whitespace collapsed, lower case."""
    return " ".join(str(text).split()).lower()


def question_groups(first: Sequence[str], second: Sequence[str]) -> np.ndarray:
    """Each pair's group number (pairs sharing a normalised question, through any chain),
    by union-find, numbered in order of first appearance."""
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
    ids: Iterable[str],
    fraction: float,
    seed: int,
    groups: Sequence[int] | None = None,
    strata: Sequence[int] | None = None,
) -> np.ndarray:
    """True for the held-out ids: about ``fraction`` of them, whole groups at a time.

    Each group is ranked by the sha256 of (seed, its smallest id): one ticket per group
    (the smallest hash over all its members would give a group of k pairs k tickets, and
    the held-out part far more duplicates). Groups are held out in rank order until
    ``round(len * fraction)`` ids are (at most one group more); both parts keep a group.
    The result depends only on the ids, groups, fraction and seed. With ``strata`` each
    label stratum gives its share."""
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
    canonical = {g: min(str(ids[i]) for i in rows) for g, rows in members.items()}
    # The canonical id breaks a (practically impossible) tie of two hashes.
    rank = {g: (hashlib.sha256(f"{seed}\0{c}".encode()).digest(), c) for g, c in canonical.items()}
    target = min(max(round(len(ids) * fraction), 1), len(ids) - 1)
    if strata is None:
        stratum = dict.fromkeys(members, 0)
        wanted = {0: target}
    else:
        strata = np.asarray(strata)
        first = {g: min(rows, key=lambda i: str(ids[i])) for g, rows in members.items()}
        stratum = {g: int(strata[first[g]]) for g in members}
        sizes: dict[int, int] = {}
        for g, rows in members.items():
            sizes[stratum[g]] = sizes.get(stratum[g], 0) + len(rows)
        wanted = quotas(sizes, target)
    held = dict.fromkeys(wanted, 0)
    mask = np.zeros(len(ids), dtype=bool)
    ranked = sorted(members, key=rank.__getitem__)
    for g in ranked[:-1]:  # the last group always stays in training
        if all(held[s] >= wanted[s] for s in wanted):
            break
        if held[stratum[g]] < wanted[stratum[g]]:
            mask[members[g]] = True
            held[stratum[g]] += len(members[g])
    return mask


#: Bins of the group-size distribution the manifest records (pairs per group).
GROUP_SIZE_BINS: tuple[tuple[str, int, float], ...] = (
    ("1", 1, 1),
    ("2", 2, 2),
    ("3-5", 3, 5),
    ("6+", 6, math.inf),
)


def number_question_groups(frames: dict[tuple[str, str], pd.DataFrame]) -> None:
    """Add ``group`` to every Quora table, numbered over all of them (the official split was
    not split by question, so a group may span train and dev)."""
    keys = [key for key in frames if key[0] == "quora"]
    if not keys:
        return
    first = [q for key in keys for q in frames[key]["sentence1"]]
    second = [q for key in keys for q in frames[key]["sentence2"]]
    groups = question_groups(first, second)
    start = 0
    for key in keys:
        frame = frames[key]
        frames[key] = frame.assign(group=groups[start : start + len(frame)])
        start += len(frame)


def describe_part(frame: pd.DataFrame) -> dict:
    """One side of the carved split for the manifest: pairs, groups, duplicate rate, the
    share of pairs in multi-pair groups and the group sizes, what a biased draw would show."""
    sizes = frame["group"].value_counts().to_numpy()
    return {
        "pairs": len(frame),
        "groups": int(len(sizes)),
        "duplicate_rate": round(float(frame["label"].mean()), 4),
        "multi_pair_group_share": round(float(sizes[sizes > 1].sum() / len(frame)), 4),
        "groups_by_size": {
            name: int(((sizes >= low) & (sizes <= high)).sum()) for name, low, high in GROUP_SIZE_BINS
        },
    }


def carve_quora(
    frames: dict[tuple[str, str], pd.DataFrame],
    origin: dict[tuple[str, str], str],
    fraction: float,
    seed: int,
) -> dict:
    """Replace the Quora dev table by a train part and a held-out part, whole question groups
    at a time; returns the manifest's ``quora_split``."""
    dev = frames.pop(("quora", "dev"))
    name = origin.pop(("quora", "dev"))
    groups = question_groups(dev["sentence1"], dev["sentence2"])
    dev = dev.assign(group=groups)
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
    train, heldout = describe_part(train_part), describe_part(held_part)

    def percent(rate: float) -> str:
        return f"{100 * rate:.1f}%"

    return {
        "kind": "carved-from-dev",
        "holdout_fraction": fraction,
        "seed": seed,
        "train_pairs": n_train,
        "heldout_pairs": n_held,
        "question_groups": int(len(sizes)),
        "largest_group_pairs": int(sizes.max()),
        "questions_across_split": crossing,
        "train": train,
        "heldout": heldout,
        "note": (
            "Quora's official 141k train split was not available; train and dev here are both carved "
            f"out of the course's labelled {name} ({len(dev)} usable pairs). Pairs that share a "
            "question (after whitespace and case normalisation), directly or through a chain of "
            f"pairs, form one group ({len(sizes)} groups); whole groups, each drawn by a seeded "
            "sha256 hash of one of its pair ids (so a group's chance does not depend on its "
            f"size), are held out as dev ({n_held} pairs, {heldout['groups']} groups, "
            f"{percent(heldout['duplicate_rate'])} duplicates) and the rest are used for training "
            f"({n_train} pairs, {train['groups']} groups, {percent(train['duplicate_rate'])} "
            "duplicates), so no question appears on both sides. Quora results from this data are "
            "measured on that held-out part and are not comparable with results on the official "
            "Quora dev set."
        ),
    }
