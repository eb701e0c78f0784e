"""The course files' CSV dialect, and a line feeder that keeps what `csv` forgets:
which physical line each record came from, and which bytes were not UTF-8.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator

from minbert.data.problems import Problem


class TabDialect(csv.Dialect):
    """Tab-separated, standard quoting, ``strict``: a malformed or unclosed quote is an error
    rather than silently glued text."""

    delimiter = "\t"
    quotechar = '"'
    doublequote = True
    skipinitialspace = False
    lineterminator = "\n"
    quoting = csv.QUOTE_MINIMAL
    strict = True


class CommaDialect(TabDialect):
    """The same rules, comma-separated (plain ``.csv`` files with named columns)."""

    delimiter = ","


class PhysicalLines:
    """Feeds a file (opened with ``surrogateescape``) to ``csv.reader`` line by line, keeping
    each line's number, the current record's lines and any non-UTF-8 byte (passed on as
    U+FFFD)."""

    def __init__(self, handle: Iterable[str], path: str, problems: list[Problem]):
        self._handle = handle
        self._path = path
        self._problems = problems
        self.exhausted = False
        #: (line number, text) of every line the parser has taken for the
        #: record it is working on; emptied by `take_record`.
        self.record: list[tuple[int, str]] = []

    def __iter__(self) -> Iterator[str]:
        offset = 0  # byte offset of the current line's start in the file
        for number, line in enumerate(self._handle, start=1):
            try:
                size = len(line.encode("utf-8"))
            except UnicodeEncodeError as err:
                raw = line.encode("utf-8", "surrogateescape")
                size = len(raw)
                column = len(line[: err.start].encode("utf-8", "surrogateescape"))
                byte = ord(line[err.start]) - 0xDC00
                self._problems.append(
                    Problem(
                        self._path,
                        number,
                        f"not valid UTF-8: byte 0x{byte:02X} at byte {column + 1} of the line "
                        f"(byte offset {offset + column} in the file); save the file as UTF-8",
                    )
                )
                line = raw.decode("utf-8", "replace")
            offset += size
            if number == 1 and line.startswith("\ufeff"):
                # A UTF-8 byte-order mark (as Excel writes) is not part of the header.
                line = line[1:]
            self.record.append((number, line))
            yield line
        self.exhausted = True

    def take_record(self) -> list[tuple[int, str]]:
        """The lines of the record just parsed (or just failed); starts a new one."""
        record, self.record = self.record, []
        return record


def last_open_quote(record: list[tuple[int, str]]) -> tuple[int | None, bool]:
    """Where the last quoted field of ``record`` opened and whether it is still open: the
    quoting rules again, to point at the quote the parser failed on."""
    opened_on: int | None = None
    state = "field-start"
    for number, line in record:
        for char in line:
            if state == "quoted":
                if char == '"':
                    state = "quote-in-quoted"
            elif state == "quote-in-quoted":
                # '""' is an escaped quote; anything else closes the field.
                state = "quoted" if char == '"' else ("field-start" if char in "\t\r\n" else "unquoted")
            elif char in "\t\r\n":
                state = "field-start"
            elif state == "field-start" and char == '"':
                state, opened_on = "quoted", number
            else:
                state = "unquoted"
    return opened_on, state == "quoted"


def record_span(record: list[tuple[int, str]]) -> str:
    first, last = record[0][0], record[-1][0]
    return f"line {first}" if first == last else f"lines {first}-{last}"
