"""The report's tables, each with its intervals, paired differences and notes.

Every "ours" cell is a metrics file's number with a 95% bootstrap interval over the
dev examples; every configuration with an ablation parent gets a paired bootstrap
of its difference from the parent on the same examples. A difference is called
distinguishable only when its interval excludes zero, and the conclusions under
each table say no more than that.
"""

from __future__ import annotations

from minbert.report.cells import (
    COLUMN_TITLES,
    COLUMNS,
    INTERVAL_NOTE,
    MODE_NAMES,
    NO_NUMBER,
    TASK_NAMES,
    TASK_TITLES,
    conclusion,
    fmt,
    fmt_difference,
    fmt_interval,
    md_header,
    md_row,
    multitask_scored,
)
from minbert.report.evidence import Evidence
from minbert.report.notes import checkpoint_notes, provenance, quora_notes


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
        INTERVAL_NOTE.replace("the parent configuration", "last layer only"),
        "",
        "How each of our numbers was produced:",
        "",
    ]
    if not by_cell:
        notes.append("- no sentiment metrics: the `sentiment` stage has not been run.")
    for m in sorted(by_cell.values(), key=lambda m: (m["task"], m["mode"])):
        ck = m["checkpoint"]
        notes.append(
            f"- `{m['run']}`: epoch {m['best_epoch']} of {m['epochs']} (best dev accuracy); "
            f"{m['train_examples']} training examples ({m['data_split']}), {m['dev_examples']} dev "
            f"examples; lr {m['lr']}, batch {m['batch_size']}, {m['optimizer']}, pooling "
            f"`{m['pooling']}`; checkpoint `{ck['name']}` ({ck['weights']} sha256 {ck['sha256'][:12]}…); "
            f"seed {m['seed']}; scale `{m['scale']}`; device {m['device']}."
        )
    notes += [""] + [f'Reference column "{r["name"]}": {r["source"].strip()}' for r in refs]
    return "\n".join(lines + notes)


def _paper_cells(paper: dict | None) -> list[str]:
    return [fmt(None if paper is None else paper.get(c)) for c in COLUMNS]


def multitask_table(
    spec: dict, runs: dict[str, dict], evidence: Evidence, zero_shot: dict | None = None
) -> str:
    """One of Tables 2-4: ours (with intervals) beside the paper's, the paired
    difference of each row from the table's parent, and where the numbers came from."""
    parent_name = spec["parent"]
    parent = (
        multitask_scored(evidence, "multitask", parent_name, runs[parent_name])
        if parent_name in runs
        else None
    )
    header = ["Configuration"]
    for c in COLUMNS:
        header += [f"{COLUMN_TITLES[c]} (ours)", f"{COLUMN_TITLES[c]} (paper)"]
    header.append(f"Δ average vs `{parent_name}`")
    lines, footnotes, differences = md_header(header), [], []

    def label_of(text: str, note: str | None = None) -> str:
        text = text.replace("|", "\\|")  # a "|" (as in |u − v|) would end the cell
        if note:
            footnotes.append(note.strip())
            text += f" [{len(footnotes)}]"
        return text

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
            iv = evidence.column(scored, c)
            cells += [fmt_interval(iv), NO_NUMBER]
        delta = fmt_difference(evidence.average_difference(scored, parent)) if parent else NO_NUMBER
        lines.append(md_row(cells + [delta]))
        if parent:
            differences.append(("zero-shot", scored))
    for row in spec["rows"]:
        config, m = row["config"], runs.get(row["config"])
        cells = [label_of(f"{row['label']} (`{config}`)", row.get("note"))]
        if m is None:
            cells += [c for p in _paper_cells(row.get("paper")) for c in ("not run", p)]
            lines.append(md_row(cells + [NO_NUMBER]))
            continue
        scored = multitask_scored(evidence, "multitask", config, m)
        for c, paper in zip(COLUMNS, _paper_cells(row.get("paper"))):
            iv = evidence.column(scored, c)
            cells += [fmt_interval(iv), paper]
        if config == parent_name:
            delta = "(parent)"
        elif parent:
            delta = fmt_difference(evidence.average_difference(scored, parent))
            differences.append((config, scored))
        else:
            delta = "parent not run"
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
        lines.append(md_row(cells + [NO_NUMBER]))

    notes = ["", INTERVAL_NOTE.replace("the parent configuration", f"`{parent_name}`")]
    if differences:
        notes += [
            "",
            f"Paired differences from `{parent_name}` (ours minus `{parent_name}`, same "
            "dev examples, 95% interval; **bold**: distinguishable from zero):",
            "",
        ]
        notes += md_header(["Configuration", *(f"Δ {COLUMN_TITLES[c]}" for c in COLUMNS)])
        said = []
        for name, scored in differences:
            ivs = {c: evidence.column_difference(scored, parent, c) for c in COLUMNS}
            notes.append(md_row([f"`{name}`", *(fmt_difference(ivs[c]) for c in COLUMNS)]))
            said.append(conclusion(name, parent_name, ivs))
        notes += ["", "What these dev sets can and cannot tell apart:", ""] + said
    present = [runs[c] for c in dict.fromkeys(r["config"] for r in spec["rows"]) if c in runs]
    notes.append("")
    if present:
        notes += quora_notes(present) + [""] + checkpoint_notes(present)
        notes += ["", "How each of our numbers was produced:", ""] + [provenance(m) for m in present]
    else:
        notes.append("None of this table's configurations has been run (stage `multitask`).")
    notes += ["", f"Paper column: {spec['source'].strip()}"]
    if footnotes:
        notes += [""] + [f"- [{i}] {n}" for i, n in enumerate(footnotes, start=1)]
    return "\n".join(lines + notes)
