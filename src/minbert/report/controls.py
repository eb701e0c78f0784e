"""Controls: each fine-tuned number against what a reader can compute without training, by
a paired bootstrap on the same dev examples: each accuracy against the strongest constant
answer (the most common dev label); and every run against
where it started (``starts_section``): its own epoch 0 and the untrained checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minbert.metrics import Interval, paired
from minbert.report.comparisons import SeedRuns, level, multitask_scored, seed_differences, seed_interval
from minbert.report.evidence import Evidence, Scored
from minbert.report.formatting import (
    COLUMN_TITLES,
    COLUMNS,
    NO_NUMBER,
    SELECTION_MEAN,
    fmt_signed,
    md_header,
    md_row,
)
from minbert.report.notes import history_series, training_budget
from minbert.results import HISTORY, run_log
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS


def _check(run: str, what: str, ours: float, control: str, iv: Interval) -> tuple:
    """A table row and whether the check is met: the interval lies above zero."""
    met = iv.low > 0
    verdict = "yes" if met else ("no: below" if iv.high < 0 else "no: not separated")
    return md_row(
        [
            what,
            f"`{run}`",
            f"{ours:.3f}",
            control,
            fmt_signed(iv),
            verdict,
        ]
    ), met


def _commonest(values: np.ndarray) -> tuple[float, float]:
    """The most common value (the lowest of equally common ones) and its share."""
    distinct, counts = np.unique(np.asarray(values), return_counts=True)
    top = int(np.argmax(counts))
    return float(distinct[top]), counts[top] / counts.sum()


def strongest_constant(labels: np.ndarray) -> int:
    """The answer that scores the highest accuracy when given for every example: the most
    common label."""
    return int(_commonest(labels)[0])


def _most_predicted(predictions: np.ndarray, what: str) -> str:
    """The measurement behind an unmet accuracy check: how much of dev gets one answer."""
    answer, share = _commonest(predictions)
    answer_text = f"{int(answer)}" if answer.is_integer() else f"{answer:g}"
    return f"predicts {what} {answer_text} for {share:.0%} of the dev examples"


def _validation_course(multitask_dir: Path | None, run: dict, task: str) -> str:
    """The run's validation score of ``task`` at epoch 0 (no encoder update yet) and at
    its chosen epoch, from its history: where a head lost what it had."""
    if multitask_dir is None or not run_log(multitask_dir, run.config, HISTORY).is_file():
        return ""
    course = " → ".join(
        f"{v:.2f}" for v in history_series(multitask_dir, run.config, "val", TASKS[task].metric_key)
    )
    return f"; validation {TASKS[task].metric_title} by epoch {course}, epoch {run.epoch} chosen"


@dataclass
class Controls:
    """The controls section's text, and what the findings say of it: the checks made and
    the ones not met (``run task``)."""

    text: str
    checked: int = 0
    missed: list[str] = field(default_factory=list)


def controls_section(
    multitask: dict[str, dict],
    sentiment: list[dict],
    evidence: Evidence,
    multitask_dir: Path | None = None,
) -> Controls:
    """The controls table, and one line naming every check that is not met (with the
    run's answers on dev and, from its history, its validation score by epoch)."""
    rows, missed, short = [], [], []

    def against_constant(name: str, task: str, title: str, ours: float, scored: Scored) -> bool:
        """One check, its row added: the run's accuracy against the strongest constant answer
        on dev (question groups resampled whole where the task has them); whether it is met
        (a missed one is then explained)."""
        labels, predicted = scored.labels[task], scored.predictions[task]
        answer = strongest_constant(labels)
        constant, groups = np.full_like(labels, answer), scored.groups.get(task)
        iv = paired(task, labels, predicted, constant, groups=groups, resamples=evidence.resamples)
        row, met = _check(name, f"{title} acc above every constant answer", ours, f"always {answer}", iv)
        rows.append(row)
        if not met:
            short.append(f"`{name}` {title}")
        return met

    for name, run in multitask.items():
        scored = multitask_scored(evidence, "multitask", name, run)
        if not against_constant(name, "sst", "SST", run.scores["sst"], scored):
            missed.append(
                f"`{name}` SST ({_most_predicted(scored.predictions['sst'], 'class')}"
                f"{_validation_course(multitask_dir, run, 'sst')})"
            )
        if not against_constant(name, "quora", "Quora", run.scores["quora"], scored):
            missed.append(
                f"`{name}` Quora ({_most_predicted(scored.predictions['quora'], 'label')}"
                f"{_validation_course(multitask_dir, run, 'quora')})"
            )
    cfimdb = [run for run in sentiment if run.task == "cfimdb"]
    for run in cfimdb:
        scored = evidence.scored(
            f"sentiment/{run.run}",
            {"cfimdb": f"sentiment/{run.run}/dev-out.csv"},
            {"cfimdb": run.accuracy},
        )
        if not against_constant(run.run, "cfimdb", "CFIMDB", run.accuracy, scored):
            missed.append(f"`{run.run}` CFIMDB")
    lines = [
        "Each run against the strongest constant answer, on the same dev examples: the most "
        "common dev label, whose share no constant answer exceeds (read from dev because it is "
        "a bound, not a model). Δ = ours − control with "
        f"its {level()} paired-bootstrap interval (Quora: question groups resampled whole); met "
        "when the interval lies above zero. Every run against where it started: the next section.",
        "",
        *md_header(["Check", "Run", "Ours", "Control", "Δ ours − control", "Met"]),
        *rows,
        "",
    ]
    if missed:
        lines.append(
            "Not met: "
            + "; ".join(missed)
            + f". At this budget ({training_budget(multitask)}) these numbers do not measure "
            "a learned head for that task: a run that gives most dev examples one answer "
            "scores about that answer's share, and the validation scores "
            "by epoch (epoch 0: the untouched encoder, its heads fresh or fitted on it) show "
            "whether the head never learned or fine-tuning took away what it had; the epoch is "
            f"chosen by {SELECTION_MEAN} on the validation split, not by this task alone. The "
            "tables' comparisons on these cells compare noise around the control."
        )
    else:
        lines.append("Every check is met.")
    return Controls("\n".join(lines), len(rows), short)


# ----------------------------------------------------------------- against the starts

ABOVE, BELOW, NOT_SEPARATED = "above", "below", "not separated"
# A cell whose untrained number is the run's own start (SST: the frozen probe both take):
# printed, not counted against the untrained checkpoint, whose count it would repeat.
OWN_START = "its own start"
# Why a run is above or below the untrained checkpoint: its start (its head fitted on the
# frozen encoder, the frozen probe of that head) is on that side already, or fine-tuning took it there.
AT_START, IN_FINE_TUNING = "its head on the frozen encoder", "fine-tuning"


def _side(iv: Interval) -> str:
    return ABOVE if iv.low > 0 else BELOW if iv.high < 0 else NOT_SEPARATED


def untrained_over_seeds(runs: dict[str, dict], zero_shot: dict, study: SeedRuns | None) -> dict[str, dict]:
    """Each configuration minus the untrained checkpoint fitted with the same seed, per
    column, as the interval over the seeds both ran with; only where there are enough."""
    out = {}
    for name in runs:
        ivs = {
            c: seed_interval(d) for c, d in (seed_differences(study, name, zero_shot.config) or {}).items()
        }
        if ivs and all(iv is not None for iv in ivs.values()):
            out[name] = ivs
    return out


def _share(names: list[str], total: int) -> str:
    """``all``, ``none``, or ``3 (`a`, `b`, `c`)``: the names only when they are few."""
    if len(names) in (0, total):
        return "all" if names else "none"
    listed = f" ({', '.join(f'`{n}`' for n in names)})" if len(names) <= 4 else ""
    return f"{len(names)}{listed}"


def lower_higher(deltas: dict[str, dict[str, Interval]], total: int) -> str:
    """``lower in 3 (...) and higher in none`` of the average's intervals in ``deltas``."""
    below = [n for n, d in deltas.items() if d[AVERAGE].high < 0]
    above = [n for n, d in deltas.items() if d[AVERAGE].low > 0]
    said = f"lower in {_share(below, total)} and higher in {_share(above, total)}"
    apart = [f"`{n}` {fmt_signed(d[AVERAGE])}" for n, d in deltas.items() if n not in below + above]
    return said + (f" (not separated: {', '.join(apart)})" if 0 < len(apart) <= 4 else "")


@dataclass
class Starts:
    """The section comparing every run with where it started, and its counts per
    comparison (``own``: its own epoch 0; ``untrained``: the untrained checkpoint), each a
    mapping of ``ABOVE``/``BELOW``/``NOT_SEPARATED`` to the cells (``config column``)."""

    text: str
    own: dict[str, list[str]] = field(default_factory=dict)
    untrained: dict[str, list[str]] = field(default_factory=dict)
    # ABOVE / BELOW -> AT_START / IN_FINE_TUNING -> the cells: what put a run on its side.
    through: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    seed: str = ""  # the tables' seed, which the counts are of
    # Per configuration and column: minus the untrained checkpoint fitted with the same seed,
    # over the seeds (untrained_over_seeds); empty without a seed study of both.
    over_seeds: dict[str, dict[str, Interval]] = field(default_factory=dict)

    def counted(self) -> str:
        """The counts in words (the tables' seed): against its own start, then against the
        untrained checkpoint (the cells where that is not the run's own start)."""
        said = (
            f"with the tables' seed {self.seed}, against its own start (epoch 0), {describe_counts(self.own)}"
        )
        if not self.untrained:
            return said
        sides = [(s, word) for s, word in ((ABOVE, "gained"), (BELOW, "lost")) if self.untrained.get(s)]
        why = (
            f" (so already at the start, {AT_START}: "
            + ", ".join(f"{s} {len(self.through[s][AT_START])}" for s, _ in sides)
            + f"; in {IN_FINE_TUNING}: "
            + ", ".join(f"{word} {len(self.through[s][IN_FINE_TUNING])}" for s, word in sides)
            + ")"
        )
        return (
            said
            + "; against the untrained checkpoint where it is not the run's own start, "
            + describe_counts(self.untrained)
            + (why if sides else "")
        )

    def over_seeds_said(self) -> str:
        """The average against the untrained checkpoint over the seeds, in words ("": none)."""
        if not self.over_seeds:
            return ""
        return (
            "Over the seeds, each configuration's average minus the untrained checkpoint's fitted "
            f"with the same seed: {lower_higher(self.over_seeds, len(self.over_seeds))} of "
            f"{len(self.over_seeds)} (intervals over seeds excluding zero; findings.md)."
        )


def starts_section(
    multitask: dict[str, dict], zero_shot: dict | None, evidence: Evidence, seed_study: SeedRuns | None = None
) -> Starts:
    """Every configuration and column against its own start (epoch 0: heads fitted on the
    frozen encoder, from its `<task>-dev-start-out.csv`) and against the untrained
    checkpoint (zero-shot; SST: the frozen checkpoint's probe), each a paired difference on
    the same dev examples; every comparison printed, above, below or not separated; over
    the seeds too where ``seed_study`` has both."""
    counts = {
        "own": {ABOVE: [], BELOW: [], NOT_SEPARATED: []},
        "untrained": {ABOVE: [], BELOW: [], NOT_SEPARATED: []},
        "through": {side: {AT_START: [], IN_FINE_TUNING: []} for side in (ABOVE, BELOW)},
    }
    base = None if zero_shot is None else multitask_scored(evidence, "zero-shot", "", zero_shot)
    rows = []
    for name, run in multitask.items():
        if set(run.start_dev) < {TASKS[t].metric_key for t in MULTITASK_TASKS}:
            continue  # a run from before every task's start was scored
        scored = multitask_scored(evidence, "multitask", name, run)
        start = evidence.scored(
            f"multitask/{name}/start",
            {t: f"multitask/{name}/{t}-dev-start-out.csv" for t in MULTITASK_TASKS},
            {t: run.start_dev[TASKS[t].metric_key] for t in MULTITASK_TASKS},
        )
        for column in COLUMNS:
            own = evidence.column_difference(scored, start, column)
            counts["own"][_side(own)].append(f"`{name}` {COLUMN_TITLES[column]}")
            cells = [f"`{name}`", COLUMN_TITLES[column], f"{evidence.value(scored, column):.3f}"]
            cells += [f"{evidence.value(start, column):.3f}", fmt_signed(own), _side(own)]
            if base is None:
                cells += [NO_NUMBER] * 4
            else:
                cell = f"`{name}` {COLUMN_TITLES[column]}"
                untrained = evidence.column_difference(scored, base, column)
                at_start = evidence.same_answers(start, base, column)
                side = OWN_START if at_start else _side(untrained)
                because = NO_NUMBER
                if not at_start:
                    counts["untrained"][side].append(cell)
                if side in (ABOVE, BELOW):  # the start against the untrained checkpoint says which
                    started = _side(evidence.column_difference(start, base, column))
                    because = AT_START if started == side else IN_FINE_TUNING
                    counts["through"][side][because].append(cell)
                cells += [f"{evidence.value(base, column):.3f}", fmt_signed(untrained), side, because]
            rows.append(md_row(cells))
    seeds = ", ".join(sorted({str(m.seed) for m in multitask.values()}))
    over = untrained_over_seeds(multitask, zero_shot, seed_study) if zero_shot is not None else {}
    if not rows:
        message = "No run records every task's start (rerun the multitask stages)."
        return Starts(message, seed=seeds, over_seeds=over)
    lines = [
        f"Every configuration and column against where it started, with the tables' seed {seeds} (over "
        f"the seeds: findings.md), on the same dev examples, with {level()} paired-bootstrap intervals "
        "(Quora: question groups resampled whole): its own start "
        "(epoch 0: the heads fitted on the frozen encoder, nothing fine-tuned; a run that keeps "
        "epoch 0 was not helped by fine-tuning) and the untrained checkpoint (zero-shot: STS and "
        "Quora by the cosine of its sentence vectors, SST by its frozen probe, the SST head every "
        "configuration starts from). Above / below: the interval lies above / below zero; "
        f'"{OWN_START}": the untrained checkpoint answers as the run\'s own start (the SST probe; '
        "the cosine STS head, which fits nothing), so the cell is not counted against the untrained "
        "checkpoint. Through: where a run is above or below the untrained checkpoint, "
        f'"{AT_START}" when its own start (its pair head fitted on the frozen checkpoint: that '
        "head's frozen probe) is on that side too, so the difference is the head's form before any "
        f'fine-tuning; "{IN_FINE_TUNING}" when the start was not.',
        "",
        *md_header(
            [
                "Configuration",
                "Column",
                "Ours",
                "Own start (its head's frozen probe)",
                "Δ vs own start",
                "",
                "Untrained",
                "Δ vs untrained",
                "",
                "Through",
            ]
        ),
        *rows,
    ]
    return Starts(
        "\n".join(lines),
        counts["own"],
        counts["untrained"],
        counts["through"],
        seeds,
        over,
    )


def describe_counts(counts: dict[str, list[str]]) -> str:
    """``above in 3, below in 1 (`a` SST acc), not separated in 2`` of a comparison's cells."""
    total = sum(len(v) for v in counts.values())
    parts = []
    for side in (ABOVE, BELOW, NOT_SEPARATED):
        cells = counts.get(side, [])
        named = f" ({', '.join(cells)})" if cells and side == BELOW and len(cells) <= 6 else ""
        parts.append(f"{side} in {len(cells)}{named}")
    return f"{', '.join(parts)} of {total}"
