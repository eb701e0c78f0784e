"""What a paired difference in the report allows: each run's evidence on dev, the seed
study's per-seed differences, their interval and the smallest difference they could detect,
and the verdict: distinguishable (bold) only when its dev bootstrap interval and its interval
over the seed study's seeds exclude zero and both rows had the same training budget;
otherwise marked with what it lacks (``MARKS_NOTE``)."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass

from scipy import stats

from minbert import metrics as scoring
from minbert.metrics import Interval
from minbert.report.evidence import Evidence, Scored
from minbert.report.formatting import COLUMN_TITLES, COLUMNS, fmt_signed, per_task
from minbert.results import STEPS
from minbert.tasks import AVERAGE, MULTITASK_TASKS

# The fewest seeds a paired interval over seeds is computed from (seed_interval).
MIN_SEEDS = 3


# The power at which the seed study's detectable difference is stated (seed_detectable).
POWER = 0.8


# Filled in by interval_note() (with MARKS_NOTE): the resampling settings are minbert.metrics' own.
INTERVAL_NOTE = (
    "Ours: the number on the full dev set, with its {level} interval from a bootstrap over the "
    "dev examples ({resamples:,} resamples, percentile method; Quora resamples whole question groups, "
    "pairs that share a question, rather than single pairs; the average resamples each task's "
    "examples on its own). Δ: ours minus {parent} on the same examples, "
    "with a {level} paired-bootstrap interval. "
)


UNSETTLED, UNEQUAL = "†", "‡"


MARKS_NOTE = (
    "**Bold**: distinguishable: the interval excludes zero, so does the paired {level} interval "
    "over seeds (the row's number minus its parent's, seed by seed, for every seed of the seed "
    "study both were trained with, the tables' own seed included: mean ± t · sd / √n, from at "
    f'least {MIN_SEEDS} seeds; section "Seed study"), and both rows had the same training budget '
    f"(optimizer steps and training examples seen). {UNSETTLED}: the interval excludes zero, "
    "but the interval over seeds does not, or was not computed (the pair shares fewer than "
    f"{MIN_SEEDS} seeds of the seed study): one seed's training run may be all that separates "
    f"them. {UNEQUAL}: the interval excludes zero, but the row made a different number of "
    "optimizer steps, or saw different training examples, than its parent: the difference may "
    "be the budget's, whatever the seeds say. Differences whose interval contains zero "
    "are unmarked: not distinguishable on these dev sets, and the table does not rank them."
)


# The verdicts on one paired difference (Comparison.verdict).
HOLDS, WITHIN_SEEDS, UNCHECKED, CONTAINS_ZERO = "holds", "within seeds", "unchecked", "contains zero"


def level() -> str:
    """The intervals' confidence level, as written: "95%"."""
    return f"{scoring.CONFIDENCE:.0%}"


def interval_note(parent: str) -> str:
    """The note under a table whose differences are ours minus ``parent``."""
    note = INTERVAL_NOTE + MARKS_NOTE
    return note.format(level=level(), resamples=scoring.BOOTSTRAP_RESAMPLES, parent=parent)


# What a multitask run's record states beside its `settings` that a choice depends on too.
STATED_BESIDE = ("batch_size", "train_examples", "validation_examples")


def ran_at(run: dict) -> dict:
    """The settings a multitask run ran at, from its record (or a search point's, in the
    same form): its `settings` (which hold no seed) and its batches and example counts."""
    return {**run["settings"], **{k: run[k] for k in STATED_BESIDE}}


def settings_digest(run: dict) -> str:
    """``ran_at`` in a few characters: what the seed study records of each configuration."""
    return hashlib.sha256(json.dumps(ran_at(run), sort_keys=True).encode()).hexdigest()[:16]


def seed_runs(study: dict | None, runs: dict[str, dict]) -> dict | None:
    """The seed study's extra seeds with the tables' own seed taken from the current metrics
    files (``runs``), per configuration and seed; ``seeds``: the extra seeds only. A
    configuration whose extra seeds ran at other settings than its current run (the study
    records them, ``settings``) keeps its own seed alone, and is named in ``other_settings``."""
    if study is None:
        return None
    own = {m["seed"] for m in runs.values()}
    recorded = study.get("settings", {})
    configs, other = {}, []
    for config, rows in study["configs"].items():
        kept = [r for r in rows if r["seed"] not in own]
        if config in runs and config in recorded and recorded[config] != settings_digest(runs[config]):
            other.append(config)
            kept = []
        if config in runs:
            kept.append({"seed": runs[config]["seed"], **{c: runs[config][c] for c in COLUMNS}})
        configs[config] = sorted(kept, key=lambda r: r["seed"])
    unrecorded = [c for c in configs if c not in recorded]
    return {
        **study,
        "seeds": sorted(set(study["seeds"]) - own),
        "configs": configs,
        "other_settings": other,
        "settings_unrecorded": unrecorded,
    }


def seed_differences(study: dict | None, config: str, parent: str) -> dict[str, list[float]] | None:
    """Per column, ``config``'s number minus ``parent``'s with each seed both were trained
    with in the seed study (``seed_runs``), in the order of the seeds; None without one."""
    if study is None:
        return None
    parent_runs = {r["seed"]: r for r in study["configs"].get(parent, [])}
    shared = [r for r in study["configs"].get(config, []) if r["seed"] in parent_runs]
    return {c: [r[c] - parent_runs[r["seed"]][c] for r in shared] for c in COLUMNS}


def seed_interval(differences: list[float]) -> Interval | None:
    """The paired interval over seeds of per-seed differences: their mean ± t · sd / √n
    (Student's t at the intervals' level, n − 1 degrees of freedom); None from fewer
    than ``MIN_SEEDS`` seeds."""
    n = len(differences)
    if n < MIN_SEEDS:
        return None
    mean = statistics.mean(differences)
    half = stats.t.ppf(0.5 + scoring.CONFIDENCE / 2, n - 1) * statistics.stdev(differences) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half)


def seed_detectable(differences: list[float]) -> float | None:
    """The smallest mean difference the seeds could detect: (t at the intervals' level + t
    at ``POWER``) · sd / √n of the per-seed differences (a two-sided paired t-test over
    n seeds, n − 1 degrees of freedom); None from fewer than ``MIN_SEEDS`` seeds."""
    n = len(differences)
    if n < MIN_SEEDS:
        return None
    t = stats.t.ppf(0.5 + scoring.CONFIDENCE / 2, n - 1) + stats.t.ppf(POWER, n - 1)
    return float(t * statistics.stdev(differences) / math.sqrt(n))


def examples(run: dict) -> int:
    """The training examples a run consumed over all epochs (all tasks together)."""
    seen = run["examples_seen"]
    return sum(seen.values()) if isinstance(seen, dict) else seen


def budget_gap(run: dict, parent: dict) -> str | None:
    """How two runs' training budgets differ, in words; None when they are the same."""
    steps, parent_steps = run[STEPS], parent[STEPS]
    seen, parent_seen = run["examples_seen"], parent["examples_seen"]
    if steps == parent_steps and seen == parent_seen:
        return None
    total, parent_total = examples(run), examples(parent)
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
    return f"{run[STEPS]:,} / {examples(run):,}"


@dataclass(frozen=True)
class Comparison:
    """What a row's paired differences from its parent are judged with: each column's
    per-seed differences in the seed study (None: no study, ``seed_differences``) and
    how the two rows' training budgets differ (None: the same, ``budget_gap``)."""

    seeds: dict[str, list[float]] | None = None
    budget: str | None = None

    def over_seeds(self, column: str) -> Interval | None:
        """The column's paired interval over seeds; None when not computed."""
        return None if self.seeds is None else seed_interval(self.seeds[column])

    @property
    def seed_count(self) -> int:
        return len(self.seeds[AVERAGE]) if self.seeds else 0

    def detectable(self, column: str) -> float | None:
        """The smallest difference the seed study could detect in the column; None
        without one."""
        return None if self.seeds is None else seed_detectable(self.seeds[column])

    def measurable(self, value: float, column: str) -> bool | None:
        """Whether a difference of ``value`` is at least what the seeds could detect;
        None without a seed study."""
        detectable = self.detectable(column)
        return None if detectable is None else abs(value) >= detectable

    def verdict(self, iv: Interval, column: str) -> str:
        if not iv.excludes_zero:
            return CONTAINS_ZERO
        seeds = self.over_seeds(column)
        if seeds is None:
            return UNCHECKED
        # Over seeds, on the same side of zero as on dev.
        return HOLDS if seeds.excludes_zero and (seeds.value > 0) == (iv.value > 0) else WITHIN_SEEDS

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
    """A paired difference: bold when distinguishable, else marked with what it lacks
    (unequal budgets outweigh the seeds: ‡ alone)."""
    text = fmt_signed(iv)
    verdict = comparison.verdict(iv, column)
    if verdict == CONTAINS_ZERO:
        return text
    if comparison.distinguishable(iv, column):
        return f"**{text}**"
    return f"{text} {UNSETTLED if comparison.budget is None else UNEQUAL}"


def multitask_scored(evidence: Evidence, folder: str, name: str, metrics: dict) -> Scored:
    """A multitask-style run's evidence: ``<folder>/<name>/<task>-dev-out.csv``."""
    prefix = f"{folder}/{name}/" if name else f"{folder}/"
    return evidence.scored(
        f"{folder}/{name}".rstrip("/"),
        {t: f"{prefix}{t}-dev-out.csv" for t in MULTITASK_TASKS},
        {t: metrics[t] for t in MULTITASK_TASKS},
    )


DETECTABLE_NOTE = (
    "Detectable: the smallest difference of the average the seed study could tell from zero "
    f"at {POWER:.0%} power (two-sided, at the intervals' level), from the per-seed differences' "
    "spread and the seed count: (t + t_power) · sd / √n; a difference below it is not "
    "measurable at this budget, whichever way it points. —: the pair is not in the seed study."
)


CONCLUSIONS_LEAD = (
    "What these dev sets can and cannot tell apart (distinguishable: the interval excludes "
    "zero, so does the paired interval over seeds, and the budgets are equal):"
)


def conclusion(
    name: str, parent: str, ivs: dict[str, Interval], comparison: Comparison = Comparison()
) -> str:
    """The one sentence the paired differences of ``name`` from ``parent`` allow."""
    said: dict[str, list[str]] = {HOLDS: [], WITHIN_SEEDS: [], UNCHECKED: [], CONTAINS_ZERO: []}
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
    below = [
        f"{COLUMN_TITLES[c]} {ivs[c].value:+.3f} (detectable {comparison.detectable(c):.3f})"
        for c in COLUMNS
        if comparison.measurable(ivs[c].value, c) is False
    ]
    unmeasured = (
        f" Not measurable at this budget, below what the seeds could detect: {', '.join(below)}."
        if below
        else ""
    )
    if not any(said[v] for v in (HOLDS, WITHIN_SEEDS, UNCHECKED)):
        return f"{head}: no difference is distinguishable from zero.{unmeasured}"
    seeds = f"the interval over {comparison.seed_count} seeds"
    lead = {
        HOLDS: f"distinguishable ({seeds} excludes zero)"
        if comparison.budget is None
        else f"interval excludes zero and so does {seeds}, but the budgets differ",
        WITHIN_SEEDS: f"interval excludes zero, but {seeds} does not",
        UNCHECKED: f"interval excludes zero, not checked over seeds (fewer than {MIN_SEEDS} in the study)",
        CONTAINS_ZERO: "not distinguishable",
    }
    return (
        f"{head}: "
        + "; ".join(f"{lead[v]}: {', '.join(items)}" for v, items in said.items() if items)
        + f".{unmeasured}"
    )
