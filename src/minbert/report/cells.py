"""The cells of the report's tables: number formats, Markdown rows, each run's evidence,
and the one sentence a paired difference allows.

A paired difference is called distinguishable (and printed bold) only when its
bootstrap interval over the dev examples excludes zero, it has the same sign with
every seed of the seed study, and both rows had the same training budget (optimizer
steps and examples seen); an interval that excludes zero without the rest is marked
with what it lacks (``MARKS_NOTE``).
"""

from __future__ import annotations

from dataclasses import dataclass

from minbert import metrics as scoring
from minbert.metrics import Interval
from minbert.report.evidence import Evidence, Scored
from minbert.results import STEPS
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS

MODE_NAMES = {"last-layer": "last layer only", "full": "full fine-tuning"}
COLUMNS = [*MULTITASK_TASKS, AVERAGE]
COLUMN_TITLES = {**{t: TASKS[t].metric_title for t in MULTITASK_TASKS}, AVERAGE: "Average"}
NO_NUMBER = "—"  # a number the source lacks
# Filled in by interval_note(): the resampling settings are minbert.metrics' own.
INTERVAL_NOTE = (
    "Ours: the number on the full dev set, with its {level} interval from a bootstrap over the "
    "dev examples ({resamples:,} resamples, percentile method; Quora resamples whole question groups, "
    "pairs that share a question, rather than single pairs; the average resamples each task's "
    "examples on its own). Δ: ours minus {parent} on the same examples, "
    "with a {level} paired-bootstrap interval. "
)
UNSETTLED, UNEQUAL = "†", "‡"
MARKS_NOTE = (
    "**Bold**: distinguishable: the interval excludes zero, the difference has the same sign "
    'with every seed of the seed study (section "Seed study"), and both rows had the same '
    "training budget (optimizer steps and training examples seen). "
    f"{UNSETTLED}: the interval excludes zero, but the sign changes with the seed, or was not "
    "checked (the row or its parent is not in the seed study): one seed's training run may "
    f"be all that separates them. {UNEQUAL}: the interval excludes zero, but the row made a "
    "different number of optimizer steps, or saw different training examples, than its "
    "parent: the difference may be the budget's. Differences whose interval contains zero "
    "are unmarked: not distinguishable on these dev sets, and the table does not rank them."
)
# The verdicts on one paired difference (Comparison.verdict).
HOLDS, FLIPS, UNCHECKED, CONTAINS_ZERO = "holds", "flips", "unchecked", "contains zero"


def level() -> str:
    """The intervals' confidence level, as written: "95%"."""
    return f"{scoring.CONFIDENCE:.0%}"


def interval_note(parent: str) -> str:
    """The note under a table whose differences are ours minus ``parent``."""
    return (
        INTERVAL_NOTE.format(level=level(), resamples=scoring.BOOTSTRAP_RESAMPLES, parent=parent) + MARKS_NOTE
    )


def fmt(x: float | None) -> str:
    return NO_NUMBER if x is None else f"{x:.3f}"


def fmt_interval(iv: Interval) -> str:
    return f"{iv.value:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def per_task(counts: dict) -> str:
    """``SST 8, Quora 8, STS 8``: in the tasks' usual order, whatever the file's."""
    order = [*MULTITASK_TASKS, *(t for t in TASKS if t not in MULTITASK_TASKS)]
    tasks = sorted(counts, key=lambda t: order.index(t) if t in order else len(order))
    return ", ".join(f"{TASKS[t].title if t in TASKS else t} {counts[t]}" for t in tasks)


def seed_differences(study: dict | None, config: str, parent: str) -> dict[str, list[float]] | None:
    """Per column, ``config``'s number minus ``parent``'s with each seed both were trained
    with in the seed study (``metrics/seed-study.json``); None when they share fewer
    than two seeds (the sign is then not checked)."""
    if study is None:
        return None
    parent_runs = {r["seed"]: r for r in study["configs"].get(parent, [])}
    shared = [r for r in study["configs"].get(config, []) if r["seed"] in parent_runs]
    if len(shared) < 2:
        return None
    return {c: [r[c] - parent_runs[r["seed"]][c] for r in shared] for c in COLUMNS}


def budget_gap(run: dict, parent: dict) -> str | None:
    """How two runs' training budgets differ, in words; None when they are the same."""
    steps, parent_steps = run[STEPS], parent[STEPS]
    seen, parent_seen = run["examples_seen"], parent["examples_seen"]
    if steps == parent_steps and seen == parent_seen:
        return None
    total, parent_total = sum(seen.values()), sum(parent_seen.values())
    words = [
        f"{steps:,} optimizer steps against {parent_steps:,}"
        if steps != parent_steps
        else f"the same {steps:,} optimizer steps"
    ]
    if seen == parent_seen:
        words.append(f"the same {total:,} training examples seen")
    elif total != parent_total:
        words.append(f"{total:,} training examples seen against {parent_total:,}")
    else:
        words.append(f"training examples seen {per_task(seen)} against {per_task(parent_seen)}")
    return "; ".join(words)


def fmt_budget(run: dict) -> str:
    """A table's "steps / examples seen" cell."""
    return f"{run[STEPS]:,} / {sum(run['examples_seen'].values()):,}"


@dataclass(frozen=True)
class Comparison:
    """What a row's paired differences from its parent are judged with: each column's
    per-seed differences in the seed study (None: not checked, ``seed_differences``)
    and how the two rows' training budgets differ (None: the same, ``budget_gap``)."""

    seeds: dict[str, list[float]] | None = None
    budget: str | None = None

    def verdict(self, iv: Interval, column: str) -> str:
        if not iv.excludes_zero:
            return CONTAINS_ZERO
        if self.seeds is None:
            return UNCHECKED
        positive = iv.value > 0
        return HOLDS if all(d != 0 and (d > 0) == positive for d in self.seeds[column]) else FLIPS

    def distinguishable(self, iv: Interval, column: str) -> bool:
        return self.verdict(iv, column) == HOLDS and self.budget is None


@dataclass(frozen=True)
class Compared:
    """A row's paired differences from its parent, per column, and what they are judged
    with: what a table's conclusions and the report's findings say."""

    name: str
    parent: str
    ivs: dict[str, Interval]
    comparison: Comparison

    def distinguishable(self, column: str = AVERAGE) -> bool:
        return self.comparison.distinguishable(self.ivs[column], column)


def fmt_difference(iv: Interval, comparison: Comparison = Comparison(), column: str = AVERAGE) -> str:
    """A paired difference: bold when distinguishable, else marked with what it lacks."""
    text = f"{iv.value:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"
    verdict = comparison.verdict(iv, column)
    if verdict == CONTAINS_ZERO:
        return text
    if comparison.distinguishable(iv, column):
        return f"**{text}**"
    marks = ("" if verdict == HOLDS else UNSETTLED) + ("" if comparison.budget is None else UNEQUAL)
    return f"{text} {marks}"


def md_row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def md_header(cells: list[str]) -> list[str]:
    return [md_row(cells), "|" + "---|" * len(cells)]


def multitask_scored(evidence: Evidence, folder: str, name: str, metrics: dict) -> Scored:
    """A multitask-style run's evidence: ``<folder>/<name>/<task>-dev-out.csv``."""
    prefix = f"{folder}/{name}/" if name else f"{folder}/"
    return evidence.scored(
        f"{folder}/{name}".rstrip("/"),
        {t: f"{prefix}{t}-dev-out.csv" for t in MULTITASK_TASKS},
        {t: metrics[t] for t in MULTITASK_TASKS},
    )


CONCLUSIONS_LEAD = (
    "What these dev sets can and cannot tell apart (distinguishable: the interval excludes "
    "zero, the sign holds with every seed of the seed study, and the budgets are equal):"
)


def conclusion(
    name: str, parent: str, ivs: dict[str, Interval], comparison: Comparison = Comparison()
) -> str:
    """The one sentence the paired differences of ``name`` from ``parent`` allow."""
    said: dict[str, list[str]] = {HOLDS: [], FLIPS: [], UNCHECKED: [], CONTAINS_ZERO: []}
    for c in COLUMNS:
        verdict = comparison.verdict(ivs[c], c)
        direction = "higher" if ivs[c].value > 0 else "lower"
        said[verdict].append(
            COLUMN_TITLES[c]
            if verdict == CONTAINS_ZERO
            else f"{COLUMN_TITLES[c]} {direction} by {abs(ivs[c].value):.3f}"
        )
    head = f"- `{name}` vs `{parent}`"
    if comparison.budget:
        head += f" (budgets differ: {comparison.budget})"
    if not any(said[v] for v in (HOLDS, FLIPS, UNCHECKED)):
        return f"{head}: no difference is distinguishable from zero."
    lead = {
        HOLDS: "distinguishable"
        if comparison.budget is None
        else "interval excludes zero and the sign holds with every seed, but the budgets differ",
        FLIPS: "interval excludes zero, but the sign changes with the seed",
        UNCHECKED: "interval excludes zero, sign across seeds not checked",
        CONTAINS_ZERO: "not distinguishable",
    }
    return (
        f"{head}: " + "; ".join(f"{lead[v]}: {', '.join(items)}" for v, items in said.items() if items) + "."
    )
