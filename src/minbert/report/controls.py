"""Controls: each fine-tuned number against what a reader can compute without training, by
a paired bootstrap on the same dev examples: SST against the training labels' majority
class and against the run's own start (its warmed-up heads), Quora against "always
not-duplicate", the cosine STS head against the untrained checkpoint's cosine, CFIMDB
against chance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.metrics import Interval, paired
from minbert.report.cells import SELECTION_MEAN, fmt_signed, md_header, md_row, multitask_scored
from minbert.report.evidence import Evidence
from minbert.results import ACCURACY, EPOCH
from minbert.tasks import TASKS

# The configurations whose STS head is the cosine (their STS is compared with zero-shot's).
COSINE_HEAD = "siamese-cosine"
# The record's score of the model fine-tuning started from, and its dev predictions.
START_SST = TASKS["sst"].metric_key


def _check(run: str, what: str, ours: float, control: str, iv: Interval, above: bool = True) -> tuple:
    """A table row and whether the check is met: ``above``, the interval lies above zero;
    else it only must not lie below zero."""
    met = iv.low > 0 if above else iv.high >= 0
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


def _most_predicted(predictions: np.ndarray, what: str) -> str:
    """The measurement behind an unmet accuracy check: how much of dev gets one answer."""
    values, counts = np.unique(np.asarray(predictions), return_counts=True)
    top = int(np.argmax(counts))
    answer = float(values[top])
    answer_text = f"{int(answer)}" if answer.is_integer() else f"{answer:g}"
    return f"predicts {what} {answer_text} for {counts[top] / counts.sum():.0%} of the dev examples"


def _validation_course(multitask_dir: Path | None, run: dict, task: str) -> str:
    """The run's validation score of ``task`` at epoch 0 (no encoder update yet) and at
    its chosen epoch, from its history: where a head lost what it had."""
    path = None if multitask_dir is None else Path(multitask_dir) / f"{run['config']}-history.csv"
    column = f"val_{TASKS[task].metric_key}"
    if path is None or not path.is_file():
        return ""
    history = pd.read_csv(path).set_index("epoch")
    if column not in history.columns:
        return ""
    course = " → ".join(f"{v:.2f}" for v in history[column])
    return f"; validation {TASKS[task].metric_title} by epoch {course}, epoch {run[EPOCH]} chosen"


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
    zero_shot: dict | None,
    evidence: Evidence,
    multitask_dir: Path | None = None,
) -> Controls:
    """The controls table, and one line naming every check that is not met (with the
    run's answers on dev and, from its history, its validation score by epoch)."""
    if zero_shot is None:
        return Controls("No zero-shot stage output (`metrics/zero-shot.json`): the controls need it.")
    base = multitask_scored(evidence, "zero-shot", "", zero_shot)
    rows, missed, short = [], [], []

    def add(row_and_met) -> bool:
        """Add the check's row; whether it is met (a missed one is then explained)."""
        row, met = row_and_met
        rows.append(row)
        return met

    for name, run in multitask.items():
        scored = multitask_scored(evidence, "multitask", name, run)
        sst = evidence.difference(scored, base, "sst")
        if not add(_check(name, "SST acc above the majority class", run["sst"], "majority class", sst)):
            short.append(f"`{name}` SST")
            missed.append(
                f"`{name}` SST ({_most_predicted(scored.predictions['sst'], 'class')}"
                f"{_validation_course(multitask_dir, run, 'sst')})"
            )
        if START_SST in run["start_dev"]:
            start = evidence.scored(
                f"multitask/{name}/start",
                {"sst": f"multitask/{name}/sst-dev-start-out.csv"},
                {"sst": run["start_dev"][START_SST]},
            )
            kept = evidence.difference(scored, start, "sst")
            control = "start (heads fitted, encoder untouched)"
            if not add(_check(name, "SST acc not below its start", run["sst"], control, kept, above=False)):
                short.append(f"`{name}` SST start")
                missed.append(
                    f"`{name}` SST below its start (acc {kept.value:+.3f} from "
                    f"{run['start_dev'][START_SST]:.3f}{_validation_course(multitask_dir, run, 'sst')})"
                )
        labels, groups = scored.labels["quora"], scored.groups.get("quora")
        constant = np.zeros_like(labels)
        quora = paired("quora", labels, scored.predictions["quora"], constant, groups=groups)
        if not add(_check(name, "Quora acc above always not-duplicate", run["quora"], "always 0", quora)):
            short.append(f"`{name}` Quora")
            missed.append(
                f"`{name}` Quora ({_most_predicted(scored.predictions['quora'], 'label')}"
                f"{_validation_course(multitask_dir, run, 'quora')})"
            )
        if run["settings"]["sts_head"] == COSINE_HEAD:
            sts = evidence.difference(scored, base, "sts")
            cosine = _check(
                name,
                "STS Pearson not below the untrained cosine",
                run["sts"],
                "zero-shot cosine",
                sts,
                above=False,
            )
            if not add(cosine):
                short.append(f"`{name}` STS")
                missed.append(
                    f"`{name}` STS (Pearson {sts.value:+.3f} from the untrained checkpoint's cosine)"
                )
    for run in sentiment:
        if run["task"] != "cfimdb":
            continue
        scored = evidence.scored(
            f"sentiment/{run['run']}",
            {"cfimdb": f"sentiment/{run['run']}/dev-out.csv"},
            {"cfimdb": run[ACCURACY]},
        )
        iv = evidence.cell(scored, "cfimdb")
        chance = Interval(iv.value - 0.5, iv.low - 0.5, iv.high - 0.5)
        if not add(_check(run["run"], "CFIMDB acc above chance", run[ACCURACY], "0.5", chance)):
            short.append(f"`{run['run']}` CFIMDB")
            missed.append(f"`{run['run']}` CFIMDB")
    lines = [
        "Each run against a control computable without training, on the same dev examples: "
        "Δ = ours − control with its 95% paired-bootstrap interval (Quora: question groups "
        "resampled whole); met when the interval lies above zero (against the untrained cosine "
        "and against the run's start: when it does not lie below zero).",
        "",
        *md_header(["Check", "Run", "Ours", "Control", "Δ ours − control", "Met"]),
        *rows,
        "",
    ]
    if missed:
        lines.append(
            "Not met: "
            + "; ".join(missed)
            + ". At this budget (a few hundred training examples per task, 3 epochs) these "
            "numbers do not measure a learned head for that task: a run that gives most dev "
            "examples one answer scores about that answer's share, and the validation scores "
            "by epoch (epoch 0: the untouched encoder, its heads fresh or fitted on it) show "
            "whether the head never learned or fine-tuning took away what it had; the epoch is "
            f"chosen by {SELECTION_MEAN} on the validation split, not by this task alone. The "
            "tables' comparisons on these cells compare noise around the control."
        )
    else:
        lines.append("Every check is met.")
    return Controls("\n".join(lines), len(rows), short)
