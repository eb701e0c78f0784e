"""How the report writes numbers and rows: number formats, markdown rows, the columns of
the multitask tables and their titles, and the names of the tasks' selection scores."""

from __future__ import annotations

from minbert.metrics import Interval
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS

MODE_NAMES = {"last-layer": "last layer only", "full": "full fine-tuning"}


COLUMNS = [*MULTITASK_TASKS, AVERAGE]


COLUMN_TITLES = {**{t: TASKS[t].metric_title for t in MULTITASK_TASKS}, AVERAGE: "Average"}


NO_NUMBER = "—"  # a number the source lacks


# The chance-corrected scores that chose the epochs and learning rates (a record's
# ``dev_selection``, the search's ``validation_*``): a constant answer scores 0 on each.
SELECTION_COLUMNS = {TASKS[t].selection_key: TASKS[t].selection_title for t in MULTITASK_TASKS}


SELECTION_MEAN = f"the mean of {', '.join(SELECTION_COLUMNS.values())}"


def fmt(x: float | None) -> str:
    return NO_NUMBER if x is None else f"{x:.3f}"


def fmt_interval(iv: Interval) -> str:
    return f"{iv.value:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def fmt_signed(iv: Interval) -> str:
    """A difference with its interval, signed: ``+0.012 [-0.003, +0.027]``; a bound that is
    not zero but rounds to it gets the digits that show its side (``[-0.020, -0.0003]``),
    so that a printed interval excludes zero exactly when the interval does."""
    return f"{iv.value:+.3f} [{fmt_bound(iv.low)}, {fmt_bound(iv.high)}]"


def fmt_bound(x: float) -> str:
    decimals = 3
    while x != 0 and round(x, decimals) == 0 and decimals < 8:
        decimals += 1
    return f"{x:+.{decimals}f}"


def fmt_setting(value) -> str:
    """A setting's value as a sentence gives it: ``lr 3e-05``, ``sst 1000, quora 200``."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt_setting(v)}" for k, v in value.items())
    return f"{value:g}" if isinstance(value, float) else str(value)


def span(values: list) -> str:
    """``5`` or ``5-30``: the smallest and largest of ``values``, once where they agree."""
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def per_task(counts: dict) -> str:
    """``SST 8, Quora 8, STS 8``: in the tasks' usual order, whatever the file's."""
    order = [*MULTITASK_TASKS, *(t for t in TASKS if t not in MULTITASK_TASKS)]
    tasks = sorted(counts, key=lambda t: order.index(t) if t in order else len(order))
    return ", ".join(f"{TASKS[t].title if t in TASKS else t} {counts[t]}" for t in tasks)


def md_row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def md_header(cells: list[str]) -> list[str]:
    return [md_row(cells), "|" + "---|" * len(cells)]
