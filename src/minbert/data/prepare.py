"""The data stage: course CSV files in, validated ``{task}-{split}.parquet`` tables and
``manifest.json`` out, the directory appearing all at once (built beside its place and
renamed when everything succeeded)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from minbert.atomic import atomic_directory
from minbert.data import download
from minbert.data.csvfile import read_task_csv
from minbert.data.problems import DataError, Problem, missing_file_problem
from minbert.data.quora_split import carve_quora, number_question_groups
from minbert.tasks import SPLITS, TASKS

#: Environment variable naming the directory with the course CSV files.
DATA_DIR_ENV = "MINBERT_DATA_DIR"
#: Where "auto" looks when the environment variable is not set: the shared
#: data folder beside the repository, relative to the working directory.
DEFAULT_SOURCE_DIR = Path("../shared/data/cs224n")
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


def resolve_source(source: str) -> Path | None:
    """The directory of the course files, or None to download: a path, ``download``, or
    ``auto`` ($MINBERT_DATA_DIR, else ../shared/data/cs224n when it exists, else
    download). A named directory that does not exist is an error, not a download."""
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
    """Build ``out_dir`` from the course files and return its manifest.

    Downloads (to ``out_dir/raw/``, from the pinned commit or ``base_url``) are always
    verified; files with no known checksum (Quora's train and test) only with
    ``allow_unverified``. With ``verify_checksums`` off a local file that differs from the
    course's (a slice) is accepted as ``verified: false``. ``skip_ids``: file -> {id:
    reason}. Without Quora's train file, train and dev are carved out of quora-dev.csv
    (``carve_quora``); Quora's tables get their ``group`` column, numbered over all of them.
    The manifest: ``source``, ``inputs``, ``unavailable``, ``tables``, ``skipped_rows``,
    ``quora_split``. Raises ``DataError`` or ``DownloadError``, leaving ``out_dir`` as it was."""
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
        number_question_groups(frames)
    else:
        quora_split = carve_quora(frames, origin, quora_holdout_fraction, split_seed)

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
    """Find or download every course file and check it: the manifest's ``inputs`` and
    ``unavailable``, and each available file's path."""
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
                        {
                            "file": name,
                            "reason": "checksum not known, so not downloaded (allow_unverified is off)",
                        }
                    )
                    continue
                path = work / "raw" / name
                actual = download.fetch(download.course_url(name, base_url), path, known)
            inputs.append({"file": name, "sha256": actual, "verified": known is not None})
            paths[name] = path
    if problems:
        raise DataError(problems)
    return inputs, unavailable, paths


def _describe_source(source: str, source_dir: Path | None, base_url: str | None) -> dict:
    if source_dir is not None:
        return {"kind": "directory", "requested": source, "path": str(source_dir)}
    url = download.course_url("{name}", base_url)
    return {"kind": "download", "repo": download.COURSE_REPO, "commit": download.COURSE_COMMIT, "url": url}
