"""The report's full tables: every "ours" cell a metrics file's number with its 95% dev
bootstrap interval, and every ablation a paired difference from its parent, marked with
the verdict of its one record (``comparisons.Compared``); each row shows its training
budget, and each Table 1 arm how validation stood at its end."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minbert.metrics import correlation_noise, rises_beyond
from minbert.report.comparisons import (
    CONCLUSIONS_LEAD,
    UNEQUAL,
    UNSETTLED,
    Compared,
    Comparison,
    budget_gap,
    fmt_budget,
    fmt_difference,
    judge,
    level,
    multitask_scored,
    seed_differences,
)
from minbert.report.evidence import Evidence
from minbert.report.formatting import (
    COLUMN_TITLES,
    COLUMNS,
    MODE_NAMES,
    NO_NUMBER,
    fmt,
    fmt_interval,
    md_header,
    md_row,
)
from minbert.report.notes import row_title
from minbert.results import HISTORY, history_column, run_log
from minbert.runs.training import MultitaskRunFile
from minbert.tasks import MULTITASK_TASKS, SENTIMENT_TASKS, TASKS


def table1(
    metrics: list[dict],
    spec: dict,
    evidence: Evidence,
    row_notes: dict[str, str] | None = None,
    ends: dict[tuple[str, str], tuple[str, str]] | None = None,
) -> str:
    """Table 1: each arm (last layer only, full fine-tuning) with its budget beside the
    references, and full minus last layer, paired (no seed study covers it: † or ‡);
    ``row_notes``: a footnote on a task's row; ``ends``: how validation stood at each
    arm's last epoch (``arm_ends``)."""
    by_cell = {(m.task, m.mode): m for m in metrics}
    scored = {key: sentiment_scored(evidence, m) for key, m in by_cell.items()}
    refs = spec["references"]
    header = ["Task"]
    for mode_name in MODE_NAMES.values():
        header += [f"{mode_name} (ours)"] + [f"{mode_name} ({r['name']})" for r in refs]
        header.append(f"{mode_name} steps / examples")
        header.append(f"{mode_name} training accuracy / epochs run")
    header.append("Δ full − last layer (ours, paired)")
    lines, gaps, footnotes = md_header(header), [], []
    for task in SENTIMENT_TASKS:
        name = f"{TASKS[task].title} ({TASKS[task].num_classes} classes)"
        if (row_notes or {}).get(task):
            footnotes.append(row_notes[task])
            name += f" [{len(footnotes)}]"
        row = [name]
        for mode in MODE_NAMES:
            ours = scored.get((task, mode))
            row.append(fmt_interval(evidence.cell(ours, task)) if ours else "not run")
            row += [fmt(r["rows"].get(task, {}).get(mode)) for r in refs]
            row.append(fmt_budget(by_cell[task, mode]) if ours else NO_NUMBER)
            row.append(fmt_trained(by_cell[task, mode]) if ours else NO_NUMBER)
        if (task, "full") in by_cell and (task, "last-layer") in by_cell:
            gap = budget_gap(by_cell[task, "full"], by_cell[task, "last-layer"])
            gaps += [f"{TASKS[task].title}: {gap}."] if gap else []
        lines.append(md_row([*row, sentiment_delta(by_cell, evidence, task)]))
    notes = [
        "",
        "Δ: full fine-tuning minus last layer only, on the same dev examples. Steps / examples: "
        "each arm's optimizer steps and the training examples it consumed (training rows × epochs). "
        "Training accuracy: the kept epoch's on the rows it trained on (as trained, dropout on): "
        "how far the arm fitted its data; epochs run, of its budget (an arm with a patience stops "
        "when validation stops improving; without one, every epoch runs).",
    ]
    if gaps:
        notes.append(
            "Where the arms' budgets differ, a Δ whose interval excludes zero is marked "
            f"{UNEQUAL} (it may be the budget's); full fine-tuning against last layer only: " + " ".join(gaps)
        )
    if not by_cell:
        notes.append("No sentiment run has been made (stage `sentiment`).")
    ended = [
        f"- {TASKS[task].title}, {MODE_NAMES[mode]}: {said}"
        for (task, mode), (_, said) in (ends or {}).items()
    ]
    if ended:
        notes += [
            "",
            "Validation at each arm's end (the score that chose its epoch; noise: the standard "
            "error of a correlation on the validation split's examples, √((1 − r²) / (n − 2))):",
            "",
            *ended,
        ]
    notes += [""] + [f'Reference column "{r["name"]}": {r["source"].strip()}' for r in refs]
    if footnotes:
        notes += [""] + [f"- [{i}] {n}" for i, n in enumerate(footnotes, start=1)]
    return "\n".join(lines + notes)


def fmt_trained(run: dict) -> str:
    """Table 1's "training accuracy / epochs run" cell."""
    return f"{fmt(run.train_accuracy)} / {run.epochs_run} of {run.epochs}"


def paper_cells(paper: dict | None) -> list[str]:
    return [fmt(None if paper is None else paper.get(c)) for c in COLUMNS]


def table_comparisons(
    spec: dict, runs: dict[str, dict], evidence: Evidence, seed_study: dict | None = None
) -> list[Compared]:
    """Each run row of one of Tables 2-4 against the table's parent, not yet judged
    within a family (``judge``)."""
    parent_name = spec["parent"]
    parent_run = runs.get(parent_name)
    if parent_run is None:
        return []
    parent = multitask_scored(evidence, "multitask", parent_name, parent_run)
    out = []
    for config in dict.fromkeys(row["config"] for row in spec["rows"]):
        run = runs.get(config)
        if run is None or config == parent_name:
            continue
        scored = multitask_scored(evidence, "multitask", config, run)
        seeds = seed_differences(seed_study, config, parent_name)
        comparison = Comparison(seeds, budget_gap(run, parent_run))
        ivs = {c: evidence.column_difference(scored, parent, c) for c in COLUMNS}
        out.append(Compared(config, parent_name, ivs, comparison))
    return out


def judged_comparisons(
    specs: list[dict], runs: dict[str, dict], evidence: Evidence, seed_study: dict | None = None
) -> list[Compared]:
    """Every comparison of the tables ``specs`` once (a row in two tables is one
    comparison), judged within its family: the comparisons with the same parent."""
    found: dict[tuple[str, str], Compared] = {}
    for spec in specs:
        for c in table_comparisons(spec, runs, evidence, seed_study):
            found.setdefault((c.name, c.parent), c)
    return judge(list(found.values()))


def multitask_table(
    spec: dict,
    runs: dict[str, dict],
    evidence: Evidence,
    zero_shot: dict | None = None,
    seed_study: dict | None = None,
    row_notes: dict[str, str] | None = None,
    judged: list[Compared] | None = None,
) -> tuple[str, list[Compared]]:
    """One of Tables 2-4: ours (with intervals) beside the paper's, each row's training
    budget, and the paired difference of each row from the table's parent, each rendered
    from its one judged record (``judged``: the report's, every family at once; without
    it, this table's rows are the family); with the comparisons, for the findings.
    ``row_notes``: a further footnote on a configuration's row."""
    parent_name = spec["parent"]
    if judged is None:
        differences = judge(table_comparisons(spec, runs, evidence, seed_study))
    else:
        by_pair = {(c.name, c.parent): c for c in judged}
        configs = dict.fromkeys(row["config"] for row in spec["rows"])
        differences = [by_pair[c, parent_name] for c in configs if (c, parent_name) in by_pair]
    by_name = {c.name: c for c in differences}
    # Paper columns only where the paper has a number for some row.
    with_paper = any(row.get("paper") for row in spec["rows"]) or bool(spec.get("test"))
    header = ["Configuration"]
    for c in COLUMNS:
        header += [f"{COLUMN_TITLES[c]} (ours)", f"{COLUMN_TITLES[c]} (paper)"][: 1 + with_paper]
    header += ["Steps / examples", f"Δ average vs `{parent_name}`"]
    lines, footnotes = md_header(header), []

    def label_of(text: str, note: str | None = None) -> str:
        text = text.replace("|", "\\|")  # a "|" (as in |u − v|) would end the cell
        if note:
            footnotes.append(note.strip())
            text += f" [{len(footnotes)}]"
        return text

    if spec.get("zero_shot") and zero_shot is not None:
        scored = multitask_scored(evidence, "zero-shot", "", zero_shot)
        method = "; ".join(f"{TASKS[t].title}: {how}" for t, how in zero_shot.method.items())
        stale = (row_notes or {}).get("zero-shot")
        cells = [
            label_of(
                "Untrained checkpoint, zero-shot (`zero-shot`)",
                f"No fine-tuning: {method}." + (f" {stale}" if stale else ""),
            )
        ]
        for c in COLUMNS:
            cells += [fmt_interval(evidence.column(scored, c)), NO_NUMBER][: 1 + with_paper]
        # A reference row, not a configuration: no difference from the parent (the
        # findings set every configuration against it instead).
        lines.append(md_row(cells + ["no fine-tuning", NO_NUMBER]))
    for row in spec["rows"]:
        config, m = row["config"], runs.get(row["config"])
        title, differs = row_title(row, m) if m is not None else (row["label"], None)
        note = " ".join(n for n in (differs, row.get("note"), (row_notes or {}).get(config)) if n)
        cells = [label_of(f"{title} (`{config}`)", note or None)]
        if m is None:
            cells += [c for p in paper_cells(row.get("paper")) for c in ("not run", p)[: 1 + with_paper]]
            lines.append(md_row(cells + ["not run", NO_NUMBER]))
            continue
        scored = multitask_scored(evidence, "multitask", config, m)
        for c, paper in zip(COLUMNS, paper_cells(row.get("paper"))):
            cells += [fmt_interval(evidence.column(scored, c)), paper][: 1 + with_paper]
        cells.append(fmt_budget(m))
        delta = (
            "(parent)"
            if config == parent_name
            else by_name[config].cell()
            if config in by_name
            else "parent not run"
        )
        lines.append(md_row(cells + [delta]))
    if spec.get("test"):
        test = spec["test"]
        tested = runs.get(test["config"])
        written = (
            "this scale writes the test predictions (`predictions/`), which no one here can score."
            if tested is not None and tested.settings.test_predictions
            else "this scale writes no test predictions (`multitask.test_predictions: false`)."
        )
        label = f"{test['label']} (`{test['config']}`)"
        cells = [label_of(label, f"The course's test labels are not public: {written}")]
        cells += [c for p in paper_cells(test["paper"]) for c in ("not scored", p)]
        lines.append(md_row(cells + [NO_NUMBER, NO_NUMBER]))

    notes = ["", f"Δ: ours minus `{parent_name}` on the same dev examples."]
    if differences:
        notes += [
            "",
            f"Paired differences from `{parent_name}` (ours minus `{parent_name}`, same "
            f"dev examples, {level()} interval; bold, {UNSETTLED} and {UNEQUAL} as above):",
            "",
        ]
        notes += md_header(["Configuration", *(f"Δ {COLUMN_TITLES[c]} vs `{parent_name}`" for c in COLUMNS)])
        notes += [md_row([f"`{d.name}`", *(d.cell(c) for c in COLUMNS)]) for d in differences]
        notes += ["", CONCLUSIONS_LEAD, ""]
        notes += [d.sentence() for d in differences]
    present = [runs[c] for c in dict.fromkeys(r["config"] for r in spec["rows"]) if c in runs]
    if not present:
        notes += ["", "None of this table's configurations has been run (stage `multitask`)."]
    elif spec.get("smart"):
        notes += ["", *smart_table(present)]
    if with_paper:
        notes += ["", f"Paper column: {spec['source'].strip()}"]
    if footnotes:
        notes += [""] + [f"- [{i}] {n}" for i, n in enumerate(footnotes, start=1)]
    return "\n".join(lines + notes), differences


def other_spec(shown: set[str], runs: dict[str, dict], parent_name: str) -> dict | None:
    """The table of the configurations of ``configs`` that no table of paper.yaml shows (a
    new entry of params.yaml, say), against ``parent_name``; None when every run has its table."""
    others = [name for name in runs if name not in shown]
    if not others:
        return None
    return {
        "parent": parent_name,
        "rows": [{"config": parent_name, "label": "the parent"}] * (parent_name in runs)
        + [{"config": name, "label": "not in the paper's tables"} for name in others],
    }


def smart_table(runs: list[MultitaskRunFile]) -> list[str]:
    """SMART's adversarial smoothness term beside its no-perturbation control, per task,
    for the runs with SMART on (their metrics' ``smart``)."""
    smart = [m for m in runs if m.settings.smart]
    if not smart:
        return ["No configuration of this table with SMART has been run."]
    lines = [
        "SMART's smoothness term, measured: the mean over the last epoch's training batches "
        "of the adversarial term as trained, and of its control:",
        "",
    ]
    lines += md_header(
        ["Configuration"]
        + [f"{TASKS[t].title} {part}" for t in MULTITASK_TASKS for part in ("adversarial", "control")]
    )
    for m in smart:
        terms = m.smart
        cells = [
            f"{part[t]:.3g}"
            for t in MULTITASK_TASKS
            for part in (terms.adversarial, terms.adversarial_control)
        ]
        lines.append(md_row([f"`{m.config}`", *cells]))
    lines += [
        "",
        "The control is the same divergence with no perturbation, under the same dropout-mask "
        "policy (SMART's settings: choices.md): what of the term is not the "
        "perturbation's doing, so only the adversarial term's excess over its control measures "
        "the perturbation.",
    ]
    return lines


def sentiment_scored(evidence: Evidence, m: dict):
    """A sentiment run's evidence: ``sentiment/<run>/dev-out.csv`` against its accuracy."""
    return evidence.scored(
        f"sentiment/{m.run}", {m.task: f"sentiment/{m.run}/dev-out.csv"}, {m.task: m.accuracy}
    )


def sentiment_accuracy(evidence: Evidence, m: dict) -> float:
    """A sentiment run's dev accuracy as recomputed from its predictions (what every cell shows)."""
    return evidence.value(sentiment_scored(evidence, m), m.task)


def sentiment_delta(by_cell: dict, evidence: Evidence, task: str) -> str:
    """Full fine-tuning minus last layer only on ``task``'s dev examples, paired, marked
    with its verdict (no seed study covers it: † or ‡)."""
    full, last = by_cell.get((task, "full")), by_cell.get((task, "last-layer"))
    if not (full and last):
        return NO_NUMBER
    gap = budget_gap(full, last)
    difference = evidence.difference(sentiment_scored(evidence, full), sentiment_scored(evidence, last), task)
    return fmt_difference(difference, Comparison(budget=gap))


# How validation stood at an arm's end (``validation_end``).
STILL_IMPROVING = "still improving"
STOPPED_WITHIN_NOISE = "stopped by its patience, no rise beyond its noise"
# Stopped with its last epoch its best: the split cannot tell that rise from noise, not a plateau.
STOPPED_AT_BEST = "stopped by its patience at its best epoch, a rise within its noise (may still be rising)"
STOPPED_BEYOND_NOISE = "stopped by its patience on a fall beyond its noise"
ENDED_WITHIN_NOISE = "its last epoch within its noise"


def arm_ends(metrics: list[dict], sentiment_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """``validation_end`` of every arm whose history is in ``sentiment_dir``, by (task,
    mode) in the tables' order: read once, for the full table and the first page."""
    by_cell = {(m.task, m.mode): m for m in metrics}
    ends = {}
    for key in ((task, mode) for task in SENTIMENT_TASKS for mode in MODE_NAMES):
        history = run_log(sentiment_dir, by_cell[key].run, HISTORY) if key in by_cell else None
        if history is not None and history.is_file():
            ends[key] = validation_end(by_cell[key], history)
    return ends


def validation_end(run: dict, history_file: Path) -> tuple[str, str]:
    """How validation stood when an arm stopped (one of the five above) and why, in words,
    by the stage's own rule (``minbert.train.loop.BestEpoch``): the last epoch that rose
    beyond validation MCC's noise above the gain before it, and where the last epoch ended
    against that epoch's score."""
    history = pd.read_csv(history_file)
    column = history_column("val", "mcc")
    scored = history[["epoch", column]].dropna()
    epochs, scores = scored["epoch"].tolist(), scored[column].tolist()
    if len(scores) < 2:
        return ENDED_WITHIN_NOISE, "one validation score: nothing to compare."
    n, gained = run.validation_examples, 0
    for i, score in enumerate(scores[1:], start=1):
        if rises_beyond(score, scores[gained], lambda reference: correlation_noise(reference, n)):
            gained = i
    reference, noise = scores[gained], correlation_noise(scores[gained], n)
    change = scores[-1] - reference
    said = (
        f"{run.epochs_run} of {run.epochs} epochs; validation MCC last rose beyond its noise at "
        f"epoch {int(epochs[gained])} ({reference:.4f}, noise ±{noise:.3f}, {n} examples)"
    )
    if gained < len(scores) - 1:
        said += f", and the last epoch ended {change:+.4f} on it"
    if run.epochs_run < run.epochs:
        at_best = gained < len(scores) - 1 and scores[-1] >= max(scores)
        kind = STOPPED_AT_BEST if at_best else STOPPED_WITHIN_NOISE
        kind = STOPPED_BEYOND_NOISE if change < -noise else kind
    else:
        kind = STILL_IMPROVING if gained == len(scores) - 1 else ENDED_WITHIN_NOISE
    return kind, f"{kind}: {said}."
