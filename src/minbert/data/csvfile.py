"""Reading and validating the course's tab-separated files with the ``csv`` module, fed one
physical line at a time, so that every bad record, byte or quote is reported with its
line (editor's line numbers, the header at 1), and every problem of a file at once."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.data.csvlines import CommaDialect, PhysicalLines, TabDialect, last_open_quote, record_span
from minbert.data.problems import DataError, Problem, missing_file_problem
from minbert.tasks import TASKS, TaskSpec

# The course files were written by pandas with its index, so each starts with
# one unnamed index column; the sst/cfimdb test files went through pandas twice
# and carry a second one (header "0", "").
_INDEX_PREFIXES: tuple[tuple[str, ...], ...] = (("",), ("0", ""))

# A plain decimal number. `float()` alone would also accept "nan", "inf" and
# "1_0", none of which is a label anyone meant to write.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")

# The csv module refuses fields over 128 KiB by default; long reviews, or a test
# file with a 1 MB field, must still load. 2**31 - 1 is the largest value every
# platform's C long accepts.
_FIELD_SIZE_LIMIT = 2**31 - 1


@dataclass
class _Scan:
    """Everything one pass over a file found."""

    path: str
    problems: list[Problem] = field(default_factory=list)
    labelled: bool = False
    columns: dict[str, list] = field(default_factory=dict)
    skipped: list[dict] = field(default_factory=list)


def _expected_headers(task: TaskSpec) -> tuple[list[str], list[str]]:
    body = ["id", *task.text_columns]
    return ["", *body, task.label_column], ["", *body]


def _match_header(header: list[str], task: TaskSpec) -> bool | str:
    """True/False (labelled or not) for a known layout, else the reason it is wrong."""
    labelled = task.label_column in header
    body = ["id", *task.text_columns] + ([task.label_column] if labelled else [])
    if any(header == [*prefix, *body] for prefix in _INDEX_PREFIXES):
        return labelled
    with_label, without_label = _expected_headers(task)
    missing = [c for c in (with_label if labelled else without_label) if c and c not in header]
    reason = (
        f"wrong columns for task {task.name!r}: found {header!r}; expected {with_label!r} "
        f"(labelled) or {without_label!r} (test file, optionally with an extra index column '0' first)"
    )
    if missing:
        reason += f"; missing {', '.join(repr(c) for c in missing)}"
    return reason


def _parse_label(text: str, task: TaskSpec) -> tuple[int | float | None, str | None]:
    """The label's value, or None and the reason it is not acceptable."""
    column = task.label_column
    stripped = text.strip()
    if not stripped:
        return None, f"{column} is empty (no label)"
    if not _NUMBER.fullmatch(stripped):
        return None, f"{column} {text!r} is not a number"
    value = float(stripped)
    if not math.isfinite(value):
        return None, f"{column} {text!r} is not a finite number"
    if task.label_kind == "class":
        # The quora labels are written as "0.0"/"1.0", so integral floats are fine.
        if not value.is_integer():
            return None, f"{column} {text!r} is not an integer class"
        if not 0 <= value < task.num_classes:
            return None, f"{column} {text!r} is outside the classes 0..{task.num_classes - 1}"
        return int(value), None
    low, high = task.score_range
    if not low <= value <= high:
        return None, f"{column} {text!r} is outside the range {low}..{high}"
    return value, None


def _task_spec(task: TaskSpec | str) -> TaskSpec:
    # Callers such as the command line only have the task's name.
    if isinstance(task, TaskSpec):
        return task
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    return TASKS[task]


def _match_named_header(header: list[str], task: TaskSpec) -> bool | str:
    """A plain file's header: the task's text columns by name, optionally ``id`` and the
    label column, in any order (other columns are not read)."""
    missing = [c for c in task.text_columns if c not in header]
    if missing:
        return (
            f"no column {', '.join(repr(c) for c in missing)} for task {task.name!r}: found "
            f"{header!r}; a file with named columns needs {list(task.text_columns)!r}, "
            f"optionally 'id' and {task.label_column!r}"
        )
    duplicated = sorted({c for c in header if c and header.count(c) > 1})
    if duplicated:
        return f"column(s) {', '.join(map(repr, duplicated))} appear more than once in the header"
    return task.label_column in header


def _scan(
    path: str | PathLike, task: TaskSpec | str, skip_ids: Mapping[str, str] | None, named: bool = False
) -> _Scan:
    """One pass over a course file, or (``named``) over a plain CSV/TSV file whose
    header names its columns: comma-separated when it ends in ``.csv``, else
    tab-separated; without an ``id`` column a row's id is ``line-<its line>``."""
    task = _task_spec(task)
    skip_ids = dict(skip_ids or {})
    where = str(path)
    scan = _Scan(where)
    problems = scan.problems
    file_path = Path(path)

    if not file_path.exists():
        problems.append(missing_file_problem(file_path))
        return scan
    if file_path.is_dir():
        problems.append(Problem(where, 0, "is a directory, expected a CSV file"))
        return scan

    if csv.field_size_limit() < _FIELD_SIZE_LIMIT:
        csv.field_size_limit(_FIELD_SIZE_LIMIT)

    header: list[str] | None = None
    layout: bool | str = False
    id_at = 0
    data_records = 0
    first_seen: dict[str, int] = {}  # id -> line of its first row
    skipped_seen: set[str] = set()

    try:
        # newline="" hands line endings to the csv parser untouched, as the csv
        # docs require, so quoted fields keep embedded newlines exactly.
        with open(file_path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
            lines = PhysicalLines(handle, where, problems)
            comma = named and file_path.suffix.lower() == ".csv"
            reader = csv.reader(lines, CommaDialect if comma else TabDialect)
            synthetic_ids = False
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as err:
                    # The parser drops the rest of the line it failed on and
                    # starts afresh on the next one; report and carry on.
                    problems.append(_malformed(where, lines.take_record(), err, lines.exhausted))
                    if header is not None:
                        data_records += 1
                    continue
                record = lines.take_record()
                if not row:
                    # Blank lines are not records (csv.DictReader, which the
                    # course's own loader uses, skips them too).
                    continue
                start = record[0][0]

                if header is None:
                    header = row
                    layout = _match_named_header(header, task) if named else _match_header(header, task)
                    if isinstance(layout, str):
                        problems.append(Problem(where, start, layout))
                    else:
                        scan.labelled = layout
                        synthetic_ids = "id" not in header
                        id_at = None if synthetic_ids else header.index("id")
                        scan.columns = {name: [] for name in _output_columns(task, scan.labelled)}
                    continue

                data_records += 1
                if isinstance(layout, str):
                    # Columns unknown: only the shape of each row can still be checked.
                    if len(row) != len(header):
                        problems.append(_wrong_width(where, record, len(header), len(row), comma))
                    continue

                row_id = row[id_at] if id_at is not None and len(row) > id_at else None
                if row_id is not None and row_id in skip_ids:
                    # Declared broken by the caller: neither an error nor data.
                    skipped_seen.add(row_id)
                    scan.skipped.append({"id": row_id, "line": start, "reason": skip_ids[row_id]})
                    continue
                if len(row) != len(header):
                    problems.append(_wrong_width(where, record, len(header), len(row), comma))
                    continue
                if synthetic_ids:
                    _check_row(scan, task, [*header, "id"], [*row, f"line-{start}"], start, first_seen)
                else:
                    _check_row(scan, task, header, row, start, first_seen)
    except OSError as err:
        problems.append(Problem(where, 0, f"cannot read file: {err.strerror or err}"))
        return scan

    if header is None:
        problems.append(Problem(where, 1, "file is empty: expected a header line and data rows"))
    elif data_records == 0:
        problems.append(Problem(where, 1, "no data rows: the file has only a header"))
    elif not isinstance(layout, str):
        for stale in sorted(set(skip_ids) - skipped_seen):
            problems.append(
                Problem(
                    where,
                    0,
                    f"the skip list names id {stale!r} ({skip_ids[stale]}) but no row has that id; "
                    "remove the stale entry",
                )
            )
    return scan


def _output_columns(task: TaskSpec, labelled: bool) -> list[str]:
    return ["id", *task.text_columns, *(["label"] if labelled else []), "line"]


def _check_row(
    scan: _Scan, task: TaskSpec, header: list[str], row: list[str], line: int, first_seen: dict[str, int]
) -> None:
    """Validate one well-shaped data row; keep it if nothing is wrong."""
    values = dict(zip(header, row))
    reasons: list[str] = []

    row_id = values["id"]
    if not row_id.strip():
        reasons.append("id is empty")
    elif row_id in first_seen:
        reasons.append(f"duplicate id {row_id!r} (first seen on line {first_seen[row_id]})")
    else:
        first_seen[row_id] = line

    for column in task.text_columns:
        text = values[column]
        if not text.strip():
            reasons.append(f"{column} is {'empty' if not text else 'whitespace-only'}")

    label = None
    if scan.labelled:
        label, reason = _parse_label(values[task.label_column], task)
        if reason:
            reasons.append(reason)

    if reasons:
        scan.problems.extend(Problem(scan.path, line, reason) for reason in reasons)
        return
    columns = scan.columns
    columns["id"].append(row_id)
    for column in task.text_columns:
        columns[column].append(values[column])
    if scan.labelled:
        columns["label"].append(label)
    columns["line"].append(line)


def _wrong_width(
    where: str, record: list[tuple[int, str]], expected: int, found: int, comma: bool = False
) -> Problem:
    reason = f"expected {expected} {'comma' if comma else 'tab'}-separated fields, found {found}"
    if len(record) > 1:
        # A record spanning several lines usually means a quote was left open
        # and swallowed the line breaks after it.
        opened_on, _ = last_open_quote(record)
        reason += f" (the record spans {record_span(record)}"
        if opened_on is not None:
            reason += f"; check the quoted field that opens on line {opened_on}"
        reason += ")"
    return Problem(where, record[0][0], reason)


def _malformed(where: str, record: list[tuple[int, str]], err: csv.Error, at_end: bool) -> Problem:
    opened_on, still_open = last_open_quote(record)
    if at_end and still_open and opened_on is not None:
        return Problem(
            where,
            opened_on,
            f"unterminated quoted field: the quote opening a field on line {opened_on} is never closed "
            f"(the record starting on line {record[0][0]} runs to the end of the file)",
        )
    # The parser's messages quote the delimiter itself; show it visibly.
    detail = str(err).replace("\t", "\\t")
    reason = f"malformed CSV ({detail}) in the record on {record_span(record)}"
    if len(record) > 1 and opened_on is not None:
        reason += f"; the quoted field opened on line {opened_on} may lack its closing quote"
    return Problem(where, record[0][0], reason)


def validate_task_csv(
    path: str | PathLike,
    task: TaskSpec | str,
    *,
    skip_ids: Mapping[str, str] | None = None,
    named: bool = False,
    labelled: bool | None = None,
) -> list[Problem]:
    """Every problem of one course file of ``task`` (or a plain file with ``named`` columns);
    ``labelled`` says whether the label column must be there or must not. Rows of
    ``skip_ids`` are not checked."""
    scan = _scan(path, task, skip_ids, named)
    if labelled is not None and not scan.problems and scan.labelled != labelled:
        column = _task_spec(task).label_column
        reason = (
            f"no label column {column!r}: a labelled file needs it (say the file is "
            "unlabelled if it is a test file)"
            if labelled
            else f"has a label column {column!r}, but an unlabelled (test) file was expected"
        )
        return [Problem(scan.path, 1, reason)]
    return scan.problems


def read_task_csv(
    path: str | PathLike,
    task: TaskSpec | str,
    *,
    skip_ids: Mapping[str, str] | None = None,
    named: bool = False,
) -> pd.DataFrame:
    """One course file of ``task`` as a DataFrame: ``id``, its text columns, ``label`` (when
    labelled) and ``line``, text as in the file. ``skip_ids`` (id -> reason) drops known
    bad rows into ``df.attrs["skipped"]``; an id the file lacks is an error, so a skip list
    cannot go stale. ``named``: a plain CSV/TSV whose header names its columns. Raises
    ``DataError`` listing every problem."""
    task = _task_spec(task)
    scan = _scan(path, task, skip_ids, named)
    if scan.problems:
        raise DataError(scan.problems)

    data: dict[str, pd.Series] = {}
    for name, values in scan.columns.items():
        if name == "label":
            dtype = np.int64 if task.label_kind == "class" else np.float64
        elif name == "line":
            dtype = np.int64
        else:
            dtype = str
        data[name] = pd.Series(values, dtype=dtype)
    frame = pd.DataFrame(data)
    frame.attrs["path"] = scan.path
    frame.attrs["skipped"] = scan.skipped
    return frame
