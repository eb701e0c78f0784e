"""What a paired difference in the report allows: each run's evidence on dev, the seed
study's per-seed differences, their interval, test and the smallest difference they could
detect, and the one verdict (``Compared``): shown (bold) only when its dev bootstrap
interval and its interval over the seed study's seeds exclude zero, the seeds' test holds
after Holm's adjustment within its family, and both rows had the same training budget;
otherwise marked with what it lacks (``MARKS_NOTE``)."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, replace

from scipy import stats

from minbert import metrics as scoring
from minbert.metrics import Interval
from minbert.report.evidence import Evidence, Scored
from minbert.report.formatting import COLUMN_TITLES, COLUMNS, fmt_bound, fmt_signed, per_task
from minbert.runs.study_files import SeedRun, SeedStudyFile
from minbert.runs.training import MultitaskRunFile, ZeroShotRunFile
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


# The one verdict each paired difference gets (Compared.verdict), written the same way in
# every table cell, sentence and page that mentions it (Compared.cell, Compared.clause).
SHOWN = "shown"  # bold
UNCONFIRMED = "not confirmed by the seeds"  # †
BUDGETS_DIFFER = "budgets differ"  # ‡
WITHIN_NOISE = "within dev noise"  # unmarked
VERDICTS = (SHOWN, UNCONFIRMED, BUDGETS_DIFFER, WITHIN_NOISE)


MARKS_NOTE = (
    "Each difference gets one verdict, the same wherever it appears:\n\n"
    f"- **Bold**, {SHOWN}: its interval excludes zero; so does the paired {{level}} interval over "
    "seeds, on the same side (the row's number minus its parent's, seed by seed, for every seed "
    "of the seed study both were trained with, the tables' own seed included: mean ± t · sd / √n, "
    f"from at least {MIN_SEEDS} seeds); the seeds' paired t-test stays below {{alpha}} after "
    "Holm's adjustment over the comparisons with the same parent (Tables 2 and 3 share "
    "`baseline`), column by column; and both rows had the same training budget (optimizer steps "
    "and training examples seen).\n"
    f"- {UNSETTLED}, {UNCONFIRMED}: the interval excludes zero, but the seeds do not confirm it, "
    "or were not run for the pair: one seed's training run may be all that separates them.\n"
    f"- {UNEQUAL}, {BUDGETS_DIFFER}: the interval excludes zero, but the row made a different "
    "number of optimizer steps, or saw different training examples, than its parent: the "
    "difference may be the budget's, whatever the seeds say.\n"
    f"- Unmarked, {WITHIN_NOISE}: the interval contains zero.\n\n"
    "Where the seeds ran, what their interval rules out is stated beside the verdict."
)


def level() -> str:
    """The intervals' confidence level, as written: "95%"."""
    return f"{scoring.CONFIDENCE:.0%}"


def alpha() -> float:
    """The level a seed test's adjusted p must stay below: 1 − the intervals' confidence."""
    return round(1 - scoring.CONFIDENCE, 10)


def interval_note(parent: str) -> str:
    """The note under a table whose differences are ours minus ``parent``."""
    note = INTERVAL_NOTE + MARKS_NOTE
    return note.format(
        level=level(), resamples=scoring.BOOTSTRAP_RESAMPLES, parent=parent, alpha=f"{alpha():g}"
    )


# What a multitask run's record states beside its `settings` that a choice depends on too.
STATED_BESIDE = ("batch_size", "train_examples", "validation_examples")


def ran_at(run: MultitaskRunFile) -> dict:
    """The settings a multitask run ran at, in its record's form (a search point's are
    recorded so too): its `settings` (which hold no seed) and its batches and example counts."""
    stated = {"batches_per_step": run.batches_per_step} if run.batches_per_step else {}  # where above 1
    return {**run.settings.as_dict(), **{k: getattr(run, k) for k in STATED_BESIDE}, **stated}


def differing(at: dict, theirs: dict, missing_differs: bool = True) -> list[str]:
    """The settings of ``at`` (a run record's form, ``ran_at``) that ``theirs`` holds
    otherwise; one ``theirs`` lacks differs unless ``missing_differs`` is false."""
    return sorted(k for k, v in at.items() if (k in theirs or missing_differs) and theirs.get(k) != v)


def settings_digest(run: MultitaskRunFile | ZeroShotRunFile) -> str:
    """``ran_at`` in a few characters: what the seed study records of each entry (of the
    untrained checkpoint: its checkpoint, pooling, scale, data and recorded settings, which
    hold no seed)."""
    if isinstance(run, ZeroShotRunFile):
        settled = {
            k: getattr(run, k) for k in ("checkpoint", "pooling", "scale", "dev_examples", "data_split")
        }
        if run.settings is not None:
            settled["settings"] = run.settings.as_dict()
    else:
        settled = ran_at(run)
    return hashlib.sha256(json.dumps(settled, sort_keys=True, default=vars).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SeedRuns:
    """The seed study as the report uses it (``seed_runs``): per configuration its runs,
    the tables' own seed among them; ``seeds``: the extra seeds only; the configurations
    whose extra seeds ran at other settings, and those whose settings it does not record."""

    study: SeedStudyFile
    seeds: list[int]
    configs: dict[str, list[SeedRun]]
    other_settings: list[str]
    settings_unrecorded: list[str]

    def means(self, name: str) -> dict[str, float] | None:
        """An entry's mean over its seeds per column; None from fewer than ``MIN_SEEDS``."""
        rows = self.configs.get(name, [])
        if len(rows) < MIN_SEEDS:
            return None
        return {c: statistics.mean(r.scores[c] for r in rows) for c in COLUMNS}


def seed_runs(
    study: SeedStudyFile | None, runs: dict[str, MultitaskRunFile], zero_shot: ZeroShotRunFile | None = None
) -> SeedRuns | None:
    """The seed study's extra seeds with the tables' own seed taken from the current metrics
    files (``runs``, and ``zero_shot``: the untrained checkpoint's), per entry and seed. An
    entry whose extra seeds ran at other settings than its current run (the study records
    them, ``settings``) keeps its own seed alone, and is named in ``other_settings``."""
    if study is None:
        return None
    own = {m.seed for m in runs.values()}
    runs = {**runs, **({zero_shot.config: zero_shot} if zero_shot is not None else {})}
    recorded = study.settings
    configs, other = {}, []
    for config, rows in study.configs.items():
        kept = [r for r in rows if r.seed not in own]
        if config in runs and config in recorded and recorded[config] != settings_digest(runs[config]):
            other.append(config)
            kept = []
        if config in runs:
            kept.append(SeedRun(runs[config].seed, config, {c: runs[config].scores[c] for c in COLUMNS}))
        configs[config] = sorted(kept, key=lambda r: r.seed)
    unrecorded = [c for c in configs if c not in recorded]
    return SeedRuns(study, sorted(set(study.seeds) - own), configs, other, unrecorded)


def seed_differences(study: SeedRuns | None, config: str, parent: str) -> dict[str, list[float]] | None:
    """Per column, ``config``'s number minus ``parent``'s with each seed both were trained
    with in the seed study (``seed_runs``), in the order of the seeds; None without one."""
    if study is None:
        return None
    parent_runs = {r.seed: r for r in study.configs.get(parent, [])}
    shared = [r for r in study.configs.get(config, []) if r.seed in parent_runs]
    return {c: [r.scores[c] - parent_runs[r.seed].scores[c] for r in shared] for c in COLUMNS}


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


def seed_p(differences: list[float]) -> float | None:
    """The two-sided paired t-test's p over seeds that the per-seed differences' mean is
    zero (n − 1 degrees of freedom); None from fewer than ``MIN_SEEDS`` seeds."""
    n = len(differences)
    if n < MIN_SEEDS:
        return None
    mean, sd = statistics.mean(differences), statistics.stdev(differences)
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def fmt_p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def holm(ps: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family's p values (None: not tested, not counted)."""
    tested = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    adjusted: list[float | None] = [None] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def examples(run: dict) -> int:
    """The training examples a run consumed over all epochs (all tasks together)."""
    seen = run.examples_seen
    return sum(seen.values()) if isinstance(seen, dict) else seen


def budget_gap(run: dict, parent: dict) -> str | None:
    """How two runs' training budgets differ, in words; None when they are the same."""
    steps, parent_steps = run.steps, parent.steps
    seen, parent_seen = run.examples_seen, parent.examples_seen
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
    return ", ".join(words)


def fmt_budget(run: dict) -> str:
    """A table's "steps / examples seen" cell."""
    return f"{run.steps:,} / {examples(run):,}"


@dataclass(frozen=True)
class Comparison:
    """What a row's paired differences from its parent are judged with: each column's
    per-seed differences in the seed study (None: no study, ``seed_differences``), how the
    two rows' training budgets differ (None: the same, ``budget_gap``), and each column's
    seed p after Holm's adjustment within its family (``judge``; the family's size)."""

    seeds: dict[str, list[float]] | None = None
    budget: str | None = None
    adjusted: dict[str, float | None] | None = None
    family: int = 1

    def over_seeds(self, column: str) -> Interval | None:
        """The column's paired interval over seeds; None when not computed."""
        return None if self.seeds is None else seed_interval(self.seeds[column])

    @property
    def seed_count(self) -> int:
        return len(self.seeds[AVERAGE]) if self.seeds else 0

    def detectable(self, column: str) -> float | None:
        """The smallest difference the seed study could detect in the column (a planning
        figure: it judges no observed difference); None without one."""
        return None if self.seeds is None else seed_detectable(self.seeds[column])

    def p(self, column: str) -> float | None:
        return None if self.seeds is None else seed_p(self.seeds[column])

    def p_adjusted(self, column: str) -> float | None:
        """The seed p adjusted within the family; unadjusted where no family was judged."""
        return self.p(column) if self.adjusted is None else self.adjusted.get(column)

    def verdict(self, iv: Interval, column: str) -> str:
        if not iv.excludes_zero:
            return WITHIN_NOISE
        if self.budget:
            return BUDGETS_DIFFER
        seeds, p = self.over_seeds(column), self.p_adjusted(column)
        # Over seeds on the same side of zero as on dev, and beyond the family's chance.
        confirmed = (
            seeds is not None
            and seeds.excludes_zero
            and (seeds.value > 0) == (iv.value > 0)
            and p is not None
            and p < alpha()
        )
        return SHOWN if confirmed else UNCONFIRMED

    def seeds_said(self, column: str) -> str:
        """What the seeds say of the column: their interval, and what it rules out or the
        test's p (raw and adjusted); without a study, that there is none."""
        seeds = self.over_seeds(column)
        if seeds is None:
            return f"fewer than {MIN_SEEDS} seeds in the seed study"
        said = f"over {self.seed_count} seeds {fmt_signed(seeds)}"
        if not seeds.excludes_zero:
            low, high = fmt_bound(seeds.low), fmt_bound(seeds.high)
            return f"{said}, which rules out a difference below {low} or above {high}"
        p, adjusted = self.p(column), self.p_adjusted(column)
        family = f"Holm over {self.family} comparisons" if self.family > 1 else "one comparison"
        return f"{said}, p {fmt_p(p)}, adjusted {fmt_p(adjusted)} ({family})"


@dataclass(frozen=True)
class Compared:
    """A row's paired differences from its parent, per column, and what they are judged
    with: the one record every table cell, sentence and page renders."""

    name: str
    parent: str
    ivs: dict[str, Interval]
    comparison: Comparison

    def verdict(self, column: str = AVERAGE) -> str:
        return self.comparison.verdict(self.ivs[column], column)

    def cell(self, column: str = AVERAGE) -> str:
        return fmt_difference(self.ivs[column], self.comparison, column)

    def clause(self, column: str = AVERAGE) -> str:
        """``Average +0.041 [+0.028, +0.055]: shown (over 5 seeds …)``: the column's
        difference, its verdict and why (never a ";": sentences join clauses with it)."""
        verdict = self.verdict(column)
        why = [self.comparison.budget] if verdict == BUDGETS_DIFFER else []
        why.append(self.comparison.seeds_said(column) if self.comparison.seeds else "one seed")
        return f"{COLUMN_TITLES[column]} {fmt_signed(self.ivs[column])}: {verdict} ({', '.join(why)})"

    def sentence(self, columns: list[str] | None = None) -> str:
        """``- `a` vs `b`: <clause>; <clause>``, over ``columns`` (all of them by default)."""
        return (
            f"- `{self.name}` vs `{self.parent}`: "
            + "; ".join(self.clause(c) for c in columns or COLUMNS)
            + "."
        )


def judge(compared: list[Compared]) -> list[Compared]:
    """``compared`` with each column's seed p adjusted by Holm within its family: the
    comparisons with the same parent (every comparison is judged once)."""
    out = list(compared)
    for parent in dict.fromkeys(c.parent for c in compared):
        members = [i for i, c in enumerate(compared) if c.parent == parent]
        adjusted: dict[int, dict[str, float | None]] = {i: {} for i in members}
        for column in COLUMNS:
            for i, p in zip(members, holm([compared[i].comparison.p(column) for i in members])):
                adjusted[i][column] = p
        for i in members:
            c = compared[i]
            comparison = replace(c.comparison, adjusted=adjusted[i], family=len(members))
            out[i] = replace(c, comparison=comparison)
    return out


def fmt_difference(iv: Interval, comparison: Comparison = Comparison(), column: str = AVERAGE) -> str:
    """A paired difference with its verdict's mark: bold when shown, † not confirmed by
    the seeds, ‡ budgets differ, unmarked within dev noise."""
    text = fmt_signed(iv)
    verdict = comparison.verdict(iv, column)
    if verdict == SHOWN:
        return f"**{text}**"
    mark = {UNCONFIRMED: UNSETTLED, BUDGETS_DIFFER: UNEQUAL}.get(verdict)
    return f"{text} {mark}" if mark else text


def multitask_scored(
    evidence: Evidence, folder: str, name: str, run: MultitaskRunFile | ZeroShotRunFile
) -> Scored:
    """A multitask-style run's evidence: ``<folder>/<name>/<task>-dev-out.csv``."""
    prefix = f"{folder}/{name}/" if name else f"{folder}/"
    return evidence.scored(
        f"{folder}/{name}".rstrip("/"),
        {t: f"{prefix}{t}-dev-out.csv" for t in MULTITASK_TASKS},
        {t: run.scores[t] for t in MULTITASK_TASKS},
    )


CONCLUSIONS_LEAD = (
    "Each comparison's verdict per column (the marks above; what the seeds rule out where they ran):"
)
