"""The data stage: course CSV files in, validated Parquet tables and a manifest out.

`prepare` gathers every task's train/dev/test file (from a local directory or
by download), checks each against its known checksum, reads and validates it,
and writes ``{task}-{split}.parquet`` plus ``manifest.json`` recording exactly
what went in and what came out. The output directory appears all at once: it
is built under a temporary name beside its final place and renamed only when
everything succeeded, so a failed run never leaves a half-prepared directory
that a later stage could take for a good one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..atomic import atomic_directory
from . import download
from .csvfile import DataError, Problem, missing_file_problem, read_task_csv
from .tasks import SPLITS, TASKS

#: Environment variable naming the directory with the course CSV files.
DATA_DIR_ENV = "MINBERT_DATA_DIR"
#: Where "auto" looks when the environment variable is not set: the shared
#: data folder beside the repository, relative to the working directory.
DEFAULT_SOURCE_DIR = Path("../shared/data/cs224n")
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


def resolve_source(source: str) -> Path | None:
    """The directory to read the course files from, or None to download them.

    `source` is a directory path, ``"download"``, or ``"auto"``: the directory
    in $MINBERT_DATA_DIR if set, else ../shared/data/cs224n (relative to the
    current directory) if it exists, else download. A directory that was asked
    for explicitly but does not exist is an error rather than a silent
    download, since the user evidently expected local data.
    """
    if source == "download":
        return None
    if source == "auto":
        from_env = os.environ.get(DATA_DIR_ENV)
        if from_env:
            return _existing_dir(Path(from_env).expanduser(), f"${DATA_DIR_ENV}")
        return DEFAULT_SOURCE_DIR if DEFAULT_SOURCE_DIR.is_dir() else None
    if not source:
        raise DataError([Problem("data.source", 0, "is empty; give a directory, 'auto' or 'download'")])
    return _existing_dir(Path(source).expanduser(), "data.source")


def _existing_dir(path: Path, named_by: str) -> Path:
    if not path.is_dir():
        raise DataError(
            [
                Problem(
                    str(path),
                    0,
                    f"the data directory named by {named_by} does not exist (looked for {path.absolute()}); "
                    f"set data.source or ${DATA_DIR_ENV} to the directory holding the course CSV files, "
                    "or set data.source to 'download'",
                )
            ]
        )
    return path


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


def holdout_mask(ids: Iterable[str], fraction: float, seed: int,
                 groups: Sequence[int] | None = None) -> np.ndarray:
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
    rank = {g: min((hashlib.sha256(f"{seed}\0{ids[i]}".encode()).digest(), ids[i]) for i in rows)
            for g, rows in members.items()}
    target = min(max(round(len(ids) * fraction), 1), len(ids) - 1)
    mask = np.zeros(len(ids), dtype=bool)
    ranked = sorted(members, key=rank.__getitem__)
    for g in ranked[:-1]:  # the last group always stays in training
        if mask.sum() >= target:
            break
        mask[members[g]] = True
    return mask


def prepare(
    source: str,
    out_dir: Path,
    *,
    quora_holdout_fraction: float,
    split_seed: int,
    skip_ids: Mapping[str, Mapping[str, str]],
    allow_unverified: bool = False,
    verify_checksums: bool = True,
    base_url: str | None = None,
) -> dict:
    """Build `out_dir` from the course files and return its manifest.

    `source` is as for `resolve_source`; downloads go to ``out_dir/raw/``, from
    the pinned course commit or from `base_url` (a mirror, or a test server).
    `skip_ids` maps a course file name to ``{id: reason}`` for rows known to be
    broken (see `read_task_csv`); the list of a file that is not available
    cannot be checked and is ignored. Files with no known checksum (the Quora
    train and test files) are downloaded only with `allow_unverified`; a local
    copy of them is used when present, with its checksum recorded. With
    `verify_checksums` off, a local copy whose checksum differs from the course
    file's (a slice, one's own data in the course format) is accepted and recorded
    as ``verified: false``; downloads are always verified. When Quora's
    train file is unavailable, train and dev are carved out of the labelled
    quora-dev.csv (see `holdout_mask`) and the manifest says so.

    The manifest (also written as ``manifest.json``) holds: ``source``;
    ``inputs`` (file, sha256, verified); ``unavailable`` (file, reason);
    ``tables`` (``{task}-{split}`` -> file, rows, source file); ``skipped_rows``
    (file, line, id, reason); and ``quora_split``.

    Raises `DataError` (bad or missing input, listing every problem found) or
    `DownloadError`; in either case `out_dir` is left as it was.
    """
    if not 0 < quora_holdout_fraction < 1:
        raise ValueError(f"quora_holdout_fraction must be strictly between 0 and 1, got {quora_holdout_fraction}")
    skip_ids = _checked_skip_ids(skip_ids)
    source_dir = resolve_source(source)

    # Absolute and normalised, so the temporary sibling works for "." or "a/..".
    target = Path(os.path.abspath(out_dir))
    with atomic_directory(target) as work:
        manifest = _build(
            work,
            source,
            source_dir,
            quora_holdout_fraction=quora_holdout_fraction,
            split_seed=split_seed,
            skip_ids=skip_ids,
            allow_unverified=allow_unverified,
            verify_checksums=verify_checksums,
            base_url=base_url,
        )
        text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
        (work / MANIFEST_NAME).write_text(text, encoding="utf-8")
    return manifest


def _checked_skip_ids(skip_ids: Mapping[str, Mapping[str, str]] | None) -> dict[str, dict[str, str]]:
    """Copy of `skip_ids`, refusing file names that are not course files (a typo
    there would otherwise turn the whole skip list into a silent no-op)."""
    known = ", ".join(sorted(download.COURSE_SHA256))
    problems = [
        Problem(str(name), 0, f"skip_ids names a file that is not a course file (known: {known})")
        for name in (skip_ids or {})
        if name not in download.COURSE_SHA256
    ]
    if problems:
        raise DataError(problems)
    return {name: {str(k): str(v) for k, v in (ids or {}).items()} for name, ids in (skip_ids or {}).items()}


def _build(
    work: Path,
    source: str,
    source_dir: Path | None,
    *,
    quora_holdout_fraction: float,
    split_seed: int,
    skip_ids: dict[str, dict[str, str]],
    allow_unverified: bool,
    verify_checksums: bool,
    base_url: str | None,
) -> dict:
    inputs, unavailable, paths = _gather(work, source_dir, allow_unverified, verify_checksums, base_url)

    # Read everything before failing, so one run reports every bad file.
    problems: list[Problem] = []
    frames: dict[tuple[str, str], pd.DataFrame] = {}
    origin: dict[tuple[str, str], str] = {}
    skipped: list[dict] = []
    for task in TASKS.values():
        for split in SPLITS:
            name = task.files[split]
            if name not in paths:
                continue
            try:
                frame = read_task_csv(paths[name], task, skip_ids=skip_ids.get(name))
            except DataError as err:
                problems.extend(err.problems)
                continue
            wants_label = split != "test"
            if ("label" in frame.columns) != wants_label:
                problems.append(
                    Problem(
                        str(paths[name]),
                        1,
                        f"a {split} file must {'have' if wants_label else 'not have'} "
                        f"the label column {task.label_column!r}",
                    )
                )
                continue
            skipped.extend(
                {"file": name, "line": row["line"], "id": row["id"], "reason": row["reason"]}
                for row in frame.attrs["skipped"]
            )
            frames[task.name, split] = frame
            origin[task.name, split] = name
    if problems:
        raise DataError(problems)

    if ("quora", "train") in frames:
        quora_split: dict = {"kind": "official"}
    else:
        quora_split = _carve_quora(frames, origin, quora_holdout_fraction, split_seed)

    tables = {}
    for task in TASKS.values():
        for split in SPLITS:
            if (task.name, split) not in frames:
                continue
            table = f"{task.name}-{split}"
            frame = frames[task.name, split].copy(deep=False)
            # attrs would otherwise be stored in the Parquet metadata; what
            # they hold (skipped rows, source path) belongs in the manifest.
            frame.attrs = {}
            frame.to_parquet(work / f"{table}.parquet", index=False)
            tables[table] = {"file": f"{table}.parquet", "rows": len(frame), "from": origin[task.name, split]}

    return {
        "manifest_version": MANIFEST_VERSION,
        "source": _describe_source(source, source_dir, base_url),
        "inputs": inputs,
        "unavailable": unavailable,
        "tables": tables,
        "skipped_rows": skipped,
        "quora_split": quora_split,
    }


def _gather(
    work: Path,
    source_dir: Path | None,
    allow_unverified: bool,
    verify_checksums: bool,
    base_url: str | None,
) -> tuple[list[dict], list[dict], dict[str, Path]]:
    """Find or download every course file and check its checksum.

    Returns the manifest's ``inputs`` and ``unavailable`` lists and the path of
    each available file. Only files with an unknown checksum may be missing.
    """
    inputs: list[dict] = []
    unavailable: list[dict] = []
    paths: dict[str, Path] = {}
    problems: list[Problem] = []
    for task in TASKS.values():
        for split in SPLITS:
            name = task.files[split]
            known = download.COURSE_SHA256.get(name)
            if source_dir is not None:
                path = source_dir / name
                if not path.is_file():
                    if known is None:
                        unavailable.append({"file": name, "reason": f"not present in {source_dir}"})
                    else:
                        problems.append(missing_file_problem(path))
                    continue
                actual = download.sha256_file(path)
                if known is not None and actual != known and not verify_checksums:
                    known = None  # accepted as the user's own data, recorded as unverified
                elif known is not None and actual != known:
                    problems.append(
                        Problem(
                            str(path),
                            0,
                            f"checksum mismatch: sha256 is {actual}, but the course file "
                            f"({download.COURSE_REPO} at commit {download.COURSE_COMMIT[:12]}) has {known}; "
                            "this copy is modified or from another version of the data, restore the original",
                        )
                    )
                    continue
            else:
                if known is None and not allow_unverified:
                    unavailable.append(
                        {"file": name, "reason": "checksum not known, so not downloaded (allow_unverified is off)"}
                    )
                    continue
                path = work / "raw" / name
                actual = download.fetch(download.course_url(name, base_url), path, known)
            inputs.append({"file": name, "sha256": actual, "verified": known is not None})
            paths[name] = path
    if problems:
        raise DataError(problems)
    return inputs, unavailable, paths


def _carve_quora(
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


def _describe_source(source: str, source_dir: Path | None, base_url: str | None) -> dict:
    if source_dir is not None:
        return {"kind": "directory", "requested": source, "path": str(source_dir)}
    url = download.course_url("{name}", base_url)
    return {"kind": "download", "repo": download.COURSE_REPO, "commit": download.COURSE_COMMIT, "url": url}

