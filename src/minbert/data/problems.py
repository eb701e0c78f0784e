"""What is wrong with an input file, with its line: a ``Problem`` per finding, a
``DataError`` carrying all of a read's."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

#: At most this many problems are spelled out in a `DataError` message.
MAX_PRINTED_PROBLEMS = 20

# Where a missing file's message tells the user to look. Kept here because the
# reader is the first place a missing file is noticed.
_HOW_TO_PROVIDE = (
    "point the data directory parameter data.source (params.yaml) or the environment "
    "variable MINBERT_DATA_DIR at a directory holding the course CSV files, "
    "or set data.source to 'download'"
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file at a 1-based physical line (0: the whole file)."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        if self.line > 0:
            return f"{self.path}:{self.line}: {self.reason}"
        return f"{self.path}: {self.reason}"


def format_problems(problems: Iterable[Problem], limit: int = MAX_PRINTED_PROBLEMS) -> str:
    """One problem per line, cut off after `limit` with a count of the rest."""
    problems = list(problems)
    lines = [str(p) for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"... and {len(problems) - limit} more")
    return "\n".join(lines)


class DataError(ValueError):
    """Bad input data; `problems` lists everything that was found wrong."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: list[Problem] = list(problems)
        super().__init__(format_problems(self.problems))


def missing_file_problem(path: str | PathLike) -> Problem:
    """The problem for a course file that is not where it should be, saying
    where it was looked for and how to provide it."""
    return Problem(str(path), 0, f"file not found (looked for {Path(path).absolute()}); {_HOW_TO_PROVIDE}")
