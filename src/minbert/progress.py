"""Progress bars for long loops, in the style of the tools researchers already use."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Progress and log lines go to stderr so stdout stays clean for results. Logs
# redirected to a file get a wide fixed width instead of wrapping at 80 columns.
console = Console(stderr=True)
if not console.is_terminal:
    console = Console(stderr=True, width=160)


# Seconds between two plain progress lines when stderr is not a terminal.
LINE_INTERVAL = 10.0


class _Lines(Progress):
    """Rich's display draws nothing until it stops when stderr is not a terminal (a log
    file, CI, `2> log`): a long stage would look hung. There, every task also logs one
    plain line every ``LINE_INTERVAL`` seconds and when it finishes."""

    def __init__(self, *columns, **kwargs):
        super().__init__(*columns, **kwargs)
        self._said: dict = {}

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._line(task_id)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._line(task_id)

    def _line(self, task_id) -> None:
        task, now = self._tasks[task_id], time.monotonic()
        if not task.finished and now - self._said.get(task_id, task.start_time or now) < LINE_INTERVAL:
            return
        self._said[task_id] = now
        eta = "" if task.time_remaining is None else f", eta {task.time_remaining:.0f} s"
        status = task.fields.get("status") or ""
        count = f"{task.completed:.0f}/{task.total:.0f}"
        self.console.log(f"{task.description}: {count}, {task.elapsed or 0:.0f} s{eta} {status}")


def progress(quiet: bool = False) -> Progress:
    """A progress display with count, elapsed time and ETA (a context manager), logging a line
    every few seconds where stderr is no terminal; ``quiet`` shows nothing."""
    kind = Progress if quiet or console.is_terminal else _Lines
    return kind(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=Console(stderr=True, quiet=True) if quiet else console,
        transient=False,
        # Off a terminal nothing is drawn until the end: no thread redrawing 10 times a second
        # beside the training loop (on 2 cores it takes the loop's time).
        auto_refresh=console.is_terminal and not quiet,
    )
