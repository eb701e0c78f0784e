"""The report's tables, each with its intervals, paired differences and notes.

Every "ours" cell is a metrics file's number with a 95% bootstrap interval over the
dev examples; every configuration with an ablation parent gets a paired bootstrap
of its difference from the parent on the same examples. A difference is called
distinguishable only when its interval excludes zero, its sign holds with every seed
of the seed study and both rows had the same training budget (``cells.Comparison``);
each row shows its budget (optimizer steps / examples seen), and the conclusions
under each table say no more than that.
"""

from __future__ import annotations

from minbert.metrics import MULTITASK_TASKS
from minbert.report.cells import (
    COLUMN_TITLES,
    COLUMNS,
    CONCLUSIONS_LEAD,
    MODE_NAMES,
    NO_NUMBER,
    TASK_NAMES,
    TASK_TITLES,
    UNEQUAL,
    UNSETTLED,
    Comparison,
    budget_gap,
    conclusion,
    fmt,
    fmt_budget,
    fmt_difference,
    fmt_interval,
    interval_note,
    level,
    md_header,
    md_row,
    multitask_scored,
    seed_differences,
)
from minbert.report.evidence import Evidence
from minbert.report.notes import checkpoint_notes, provenance, quora_notes, selection_note

# What a row without training (the zero-shot checkpoint) is compared by.
NO_TRAINING = {"optimizer_steps": 0, "examples_seen": dict.fromkeys(MULTITASK_TASKS, 0)}
BUDGET_NOTE = (
    "Steps / examples: the optimizer steps over all epochs, and the training examples "
    'consumed over all epochs, all tasks together (per task under "How each of our numbers '
    'was produced").'
)


def table1(metrics: list[dict], spec: dict, evidence: Evidence) -> str:
    by_cell = {(m["task"], m["mode"]): m for m in metrics}
    scored = {
        key: evidence.scored(
            f"sentiment/{m['run']}",
            {m["task"]: f"sentiment/{m['run']}/dev-out.csv"},
            {m["task"]: m["dev_accuracy"]},
        )
        for key, m in by_cell.items()
    }
    refs = spec["references"]
    header = ["Task"]
    for mode_name in MODE_NAMES.values():
        header += [f"{mode_name} (ours)"] + [f"{mode_name} ({r['name']})" for r in refs]
    header.append("Δ full − last layer (ours, paired)")
    lines = md_header(header)
    for task, name in TASK_NAMES.items():
        row = [name]
        for mode in MODE_NAMES:
            ours = scored.get((task, mode))
            row.append(fmt_interval(evidence.cell(ours, task)) if ours else "not run")
            row += [fmt(r["rows"].get(task, {}).get(mode)) for r in refs]
        full, last = scored.get((task, "full")), scored.get((task, "last-layer"))
        row.append(fmt_difference(evidence.difference(full, last, task)) if full and last else NO_NUMBER)
        lines.append(md_row(row))
    notes = [
        "",
        interval_note("last layer only"),
        "",
        "How each of our numbers was produced:",
        "",
    ]
    if not by_cell:
        notes.append("- no sentiment metrics: the `sentiment` stage has not been run.")
    for m in sorted(by_cell.values(), key=lambda m: (m["task"], m["mode"])):
        ck = m["checkpoint"]
        validation = f"{m['validation_examples']} validation examples, " if "validation_examples" in m else ""
        head = f" (head {m['head_lr']})" if m.get("head_lr", m["lr"]) != m["lr"] else ""
        notes.append(
            f"- `{m['run']}`: epoch {m['best_epoch']} of {m['epochs']} "
            f"({m.get('selection', 'best dev accuracy')}); {m['train_examples']} training examples "
            f"({m['data_split']}), {validation}{m['dev_examples']} dev examples; lr {m['lr']}{head}, "
            f"batch {m['batch_size']}, {m['optimizer']}, pooling `{m['pooling']}`; checkpoint "
            f"`{ck['name']}` ({ck['weights']} sha256 {ck['sha256'][:12]}…); seed {m['seed']}; "
            f"scale `{m['scale']}`; device {m['device']}."
        )
    notes += [""] + [f'Reference column "{r["name"]}": {r["source"].strip()}' for r in refs]
    return "\n".join(lines + notes)


def _paper_cells(paper: dict | None) -> list[str]:
    return [fmt(None if paper is None else paper.get(c)) for c in COLUMNS]


def multitask_table(
    spec: dict,
    runs: dict[str, dict],
    evidence: Evidence,
    zero_shot: dict | None = None,
    seed_study: dict | None = None,
) -> str:
    """One of Tables 2-4: ours (with intervals) beside the paper's, each row's training
    budget, the paired difference of each row from the table's parent (judged with the
    seed study, ``Comparison``), and where the numbers came from."""
    parent_name = spec["parent"]
    parent_run = runs.get(parent_name)
    parent = multitask_scored(evidence, "multitask", parent_name, parent_run) if parent_run else None
    header = ["Configuration"]
    for c in COLUMNS:
        header += [f"{COLUMN_TITLES[c]} (ours)", f"{COLUMN_TITLES[c]} (paper)"]
    header += ["Steps / examples", f"Δ average vs `{parent_name}`"]
    lines, footnotes, differences = md_header(header), [], []

    def label_of(text: str, note: str | None = None) -> str:
        text = text.replace("|", "\\|")  # a "|" (as in |u − v|) would end the cell
        if note:
            footnotes.append(note.strip())
            text += f" [{len(footnotes)}]"
        return text

    def compared(name: str, run: dict, scored) -> str:
        """The Δ average cell; remembers the row for the paired-differences table."""
        if parent is None:
            return "parent not run"
        comparison = Comparison(seed_differences(seed_study, name, parent_name), budget_gap(run, parent_run))
        differences.append((name, scored, comparison))
        return fmt_difference(evidence.average_difference(scored, parent), comparison)

    if spec.get("zero_shot") and zero_shot is not None:
        scored = multitask_scored(evidence, "zero-shot", "", zero_shot)
        cells = [
            label_of(
                "Untrained checkpoint, zero-shot (`zero-shot`)",
                "No fine-tuning: "
                + "; ".join(f"{TASK_TITLES[t]}: {how}" for t, how in zero_shot["method"].items())
                + ".",
            )
        ]
        for c in COLUMNS:
            cells += [fmt_interval(evidence.column(scored, c)), NO_NUMBER]
        cells.append(fmt_budget(NO_TRAINING))
        lines.append(md_row(cells + [compared("zero-shot", NO_TRAINING, scored)]))
    for row in spec["rows"]:
        config, m = row["config"], runs.get(row["config"])
        cells = [label_of(f"{row['label']} (`{config}`)", row.get("note"))]
        if m is None:
            cells += [c for p in _paper_cells(row.get("paper")) for c in ("not run", p)]
            lines.append(md_row(cells + ["not run", NO_NUMBER]))
            continue
        scored = multitask_scored(evidence, "multitask", config, m)
        for c, paper in zip(COLUMNS, _paper_cells(row.get("paper"))):
            cells += [fmt_interval(evidence.column(scored, c)), paper]
        cells.append(fmt_budget(m))
        delta = "(parent)" if config == parent_name else compared(config, m, scored)
        lines.append(md_row(cells + [delta]))
    if spec.get("test"):
        test = spec["test"]
        cells = [
            label_of(
                f"{test['label']} (`{test['config']}`)",
                "The course's test labels are not public: this pipeline writes test "
                "predictions (`predictions/`) but cannot score them.",
            )
        ]
        cells += [c for p in _paper_cells(test["paper"]) for c in ("not scored", p)]
        lines.append(md_row(cells + [NO_NUMBER, NO_NUMBER]))

    notes = ["", interval_note(f"`{parent_name}`"), "", BUDGET_NOTE]
    if differences:
        notes += [
            "",
            f"Paired differences from `{parent_name}` (ours minus `{parent_name}`, same "
            f"dev examples, {level()} interval; bold, {UNSETTLED} and {UNEQUAL} as above):",
            "",
        ]
        notes += md_header(["Configuration", *(f"Δ {COLUMN_TITLES[c]}" for c in COLUMNS)])
        said = []
        for name, scored, comparison in differences:
            ivs = {c: evidence.column_difference(scored, parent, c) for c in COLUMNS}
            notes.append(md_row([f"`{name}`", *(fmt_difference(ivs[c], comparison, c) for c in COLUMNS)]))
            said.append(conclusion(name, parent_name, ivs, comparison))
        notes += ["", CONCLUSIONS_LEAD, ""] + said
    present = [runs[c] for c in dict.fromkeys(r["config"] for r in spec["rows"]) if c in runs]
    notes.append("")
    if present:
        notes += quora_notes(present) + [""] + checkpoint_notes(present)
        if spec.get("smart"):
            notes += ["", *smart_table(present)]
        notes += ["", "How each of our numbers was produced:", "", selection_note(present), ""]
        notes += [provenance(m) for m in present]
    else:
        notes.append("None of this table's configurations has been run (stage `multitask`).")
    notes += ["", f"Paper column: {spec['source'].strip()}"]
    if footnotes:
        notes += [""] + [f"- [{i}] {n}" for i, n in enumerate(footnotes, start=1)]
    return "\n".join(lines + notes)


def smart_table(runs: list[dict]) -> list[str]:
    """SMART's adversarial smoothness term beside its no-perturbation control, per task,
    for the runs with SMART on (their metrics' ``smart``)."""
    smart = [m for m in runs if m["settings"].get("smart")]
    if not smart:
        return ["No configuration of this table with SMART has been run."]
    lines = [
        "SMART's smoothness term, measured: the mean over the last epoch's training batches "
        "of the adversarial term as trained, and of its control:",
        "",
    ]
    lines += md_header(
        ["Configuration"]
        + [f"{TASK_TITLES[t]} {part}" for t in MULTITASK_TASKS for part in ("adversarial", "control")]
    )
    for m in smart:
        terms = m["smart"]
        cells = [
            f"{terms[part][t]:.3g}"
            for t in MULTITASK_TASKS
            for part in ("adversarial", "adversarial_control")
        ]
        lines.append(md_row([f"`{m['config']}`", *cells]))
    lines += [
        "",
        "The control is the same divergence with no perturbation, under the same dropout-mask "
        "policy (SMART's settings in the choices below): what of the term is not the "
        "perturbation's doing, so only the adversarial term's excess over its control measures "
        "the perturbation.",
    ]
    return lines
