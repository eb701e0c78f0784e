"""Progress bars for long loops, in the style of the tools researchers already use."""

from __future__ import annotations

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


def progress(quiet: bool = False) -> Progress:
    """A progress display with count, elapsed time and ETA; use as a context manager.

    ``quiet`` shows and logs nothing (the ranks other than 0 of a data-parallel run).
    """
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=Console(stderr=True, quiet=True) if quiet else console,
        transient=False,
    )
