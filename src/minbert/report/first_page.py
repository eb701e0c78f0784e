"""The report's first page (report/README.md): its tables, each a short form of Tables
1-4 with ours, the GPU's and the paper's numbers side by side and every difference marked
with the verdict of its one record (the full tables are on tables.md); and the pages it
lists."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minbert.report.comparisons import MIN_SEEDS, Compared, multitask_scored
from minbert.report.evidence import Evidence
from minbert.report.formatting import (
    COLUMN_TITLES,
    COLUMNS,
    MODE_NAMES,
    NO_NUMBER,
    fmt,
    fmt_signed,
    md_header,
    md_row,
)
from minbert.report.notes import row_title
from minbert.report.tables import (
    ENDED_WITHIN_NOISE,
    paper_cells,
    sentiment_accuracy,
    sentiment_delta,
)
from minbert.tasks import AVERAGE, SENTIMENT_TASKS, TASKS

# The pages beside the first (report/README.md), in the order it lists them: what each holds.
PAGES = {
    "findings.md": "Setup beside the paper's, and the findings",
    "tables.md": "Tables 1-4 in full: intervals, budgets, paired differences per task, footnotes",
    "controls.md": "Controls, and each run against where it started",
    "budget.md": "What this budget can and cannot detect",
    "smart.md": "SMART at this budget: what its settings rest on",
    "choices.md": "Choices: where the paper is silent, and what chose each setting",
    "seeds.md": "Seed study",
    "mlm.md": "MLM pretraining before fine-tuning",
    "gpu.md": "On a GPU: the `gpu` scale in full",
    "figures.md": "Figures",
    "provenance.md": "How each number was produced",
}
# {level}: the intervals' confidence level (comparisons.level).
READING_NOTE = (
    "Reading Tables 2-4 below: each number is the mean over every seed the configuration was "
    "trained with (Seeds: how many; seeds.md), on the full dev sets; Δ: the mean over those seeds "
    "of the row's average minus its parent's, seed by seed, with its {level} interval over seeds and "
    "the comparison's one verdict: shown, not confirmed by the seeds, budgets differ, or within "
    "dev noise (how each is reached, and the tables' own seed with its dev intervals and marks: "
    "tables.md). GPU: the `gpu` scale's one run where one has been made (stale: its code has "
    "changed since, gpu.md), its Δ over the dev examples; paper: the paper's. Table 1: the "
    "tables' seed, its Δ marked bold shown, † not confirmed by the seeds, ‡ budgets differ. "
    "A number marked one answer comes from the same answer for every dev example (the "
    "untrained checkpoint's SST without a probe: the training labels' majority class)."
)
# The mark of a task a run answered alike for every dev example (READING_NOTE).
ONE_ANSWER = "one answer"


def _stale(stale: dict[str, list[str]] | None, stage: str) -> str:
    return " (stale)" if (stale or {}).get(stage) else ""


def compact_table1(
    metrics: list[dict],
    spec: dict,
    evidence: Evidence,
    gpu_metrics: list[dict] | None = None,
    gpu_stale: dict[str, list[str]] | None = None,
    gpu_evidence: Evidence | None = None,
    ends: dict[tuple[str, str], tuple[str, str]] | None = None,
) -> list[str]:
    """Table 1 on the first page: each arm's dev accuracy, ours, on a GPU and the
    paper's, and full minus last layer (the same cells as the full table's)."""
    ours = {(m.task, m.mode): m for m in metrics}
    on_gpu = {(m.task, m.mode): m for m in gpu_metrics or []}
    paper = next(r for r in spec["references"] if r["name"] == "paper")["rows"]
    header = ["Task"]
    for mode_name in MODE_NAMES.values():
        header += [f"{mode_name} (ours)"] + [f"{mode_name} (GPU)"] * bool(on_gpu) + [f"{mode_name} (paper)"]
    lines = md_header([*header, "Δ full − last layer (ours, paired)"])
    for task in SENTIMENT_TASKS:
        row = [f"{TASKS[task].title} ({TASKS[task].num_classes} classes)"]
        for mode in MODE_NAMES:
            m, g = ours.get((task, mode)), on_gpu.get((task, mode))
            row.append(fmt(sentiment_accuracy(evidence, m)) if m else "not run")
            if on_gpu:
                stale = _stale(gpu_stale, f"sentiment@{g.run}") if g else ""
                row.append(fmt(sentiment_accuracy(gpu_evidence, g)) + stale if g else "not run")
            row.append(fmt(paper.get(task, {}).get(mode)))
        lines.append(md_row([*row, sentiment_delta(ours, evidence, task)]))
    ended: dict[str, list[str]] = {}
    for task, mode in (key for key in ours if key in (ends or {})):
        ended.setdefault(ends[task, mode][0], []).append(f"{TASKS[task].title} {MODE_NAMES[mode]}")
    said = [f"{kind}: {', '.join(arms)}" for kind, arms in ended.items() if kind != ENDED_WITHIN_NOISE]
    if said:
        lines += ["", "Validation at an arm's end (ours; tables.md gives each): " + "; ".join(said) + "."]
    return lines


def compact_table(
    spec: dict,
    runs: dict[str, dict],
    evidence: Evidence,
    judged: list[Compared],
    zero_shot: dict | None = None,
    gpu: GpuColumns | None = None,
    seed_study: dict | None = None,
    outside: dict[str, str] | None = None,
) -> list[str]:
    """One of Tables 2-4 on the first page: each row's numbers as the mean over every seed
    it was trained with (``seed_runs``; one seed's where the study has fewer than
    ``MIN_SEEDS``), the GPU's and the paper's; its difference of the average from the
    parent over those seeds, with its interval and the verdict of its one record
    (``judged``, ``gpu.judged``). The tables' own seed and its dev intervals: tables.md.
    ``outside``: the note of each row `dvc repro` does not run (``ExtraRuns.notes``)."""
    parent = spec["parent"]
    with_paper = any(row.get("paper") for row in spec["rows"])
    header = ["Configuration", *(COLUMN_TITLES[c] for c in COLUMNS), "Seeds", f"Δ average vs `{parent}`"]
    if gpu:
        header += [f"GPU {COLUMN_TITLES[c]}" for c in COLUMNS] + [f"GPU Δ average vs `{parent}`"]
    if with_paper:
        header += [f"paper {COLUMN_TITLES[c]}" for c in COLUMNS]
    lines = md_header(header)
    seeded = seed_study.configs if seed_study else {}
    # A row `dvc repro` does not run is marked, its note under the table (as on tables.md).
    marked = [row["config"] for row in spec["rows"] if row["config"] in (outside or {})]

    def numbers(ev: Evidence, folder: str, config: str, run: dict | None, entry: str = "") -> list[str]:
        if run is None:
            return ["not run"] * len(COLUMNS)
        means = seed_study.means(entry) if seed_study and entry else None  # entry: its name there
        if means is not None:
            return [fmt(means[c]) for c in COLUMNS]
        scored = multitask_scored(ev, folder, config, run)
        # A task answered alike for every dev example scores what a constant does: marked.
        alike = {t for t, p in scored.predictions.items() if len(np.unique(p)) == 1}
        return [fmt(ev.value(scored, c)) + (f" ({ONE_ANSWER})" if c in alike else "") for c in COLUMNS]

    def seeds(config: str) -> str:
        count = len(seeded.get(config, []))
        return str(count) if count >= MIN_SEEDS else "1"

    def delta(records: list[Compared], config: str, run: dict | None) -> str:
        if run is None:
            return NO_NUMBER
        if config == parent:
            return "(parent)"
        found = [c for c in records if (c.name, c.parent) == (config, parent)]
        if not found:
            return "parent not run"
        record = found[0]
        over = record.comparison.over_seeds(AVERAGE)
        if over is None:  # one seed: its dev interval
            return f"{fmt_signed(record.ivs[AVERAGE])} (one seed): {record.verdict()}"
        return f"{fmt_signed(over)} ({record.comparison.seed_count} seeds): {record.verdict()}"

    if spec.get("zero_shot") and zero_shot is not None:
        cells = [
            "Untrained checkpoint, zero-shot (`zero-shot`)",
            *numbers(evidence, "zero-shot", "", zero_shot, zero_shot.config),
        ]
        cells += [seeds(zero_shot.config), NO_NUMBER]
        if gpu:
            gpu_cells = numbers(gpu.evidence, "zero-shot", "", gpu.zero_shot)
            if gpu.zero_shot is not None:
                gpu_cells[-1] += _stale(gpu.stale, "zero-shot")
            cells += [*gpu_cells, NO_NUMBER]
        lines.append(md_row(cells + [NO_NUMBER] * len(COLUMNS) * with_paper))
    for row in spec["rows"]:
        config, m = row["config"], runs.get(row["config"])
        title = row_title(row, m)[0] if m is not None else row["label"]
        mark = f" [{marked.index(config) + 1}]" if config in marked else ""
        cells = [
            f"{title} (`{config}`){mark}".replace("|", "\\|"),
            *numbers(evidence, "multitask", config, m, config),
        ]
        cells += [seeds(config) if m else NO_NUMBER, delta(judged, config, m)]
        if gpu:
            g = gpu.runs.get(config)
            gpu_cells = numbers(gpu.evidence, "multitask", config, g)
            if g is not None:
                gpu_cells[-1] += _stale(gpu.stale, f"multitask@{config}")
            cells += [*gpu_cells, delta(gpu.judged, config, g)]
        if with_paper:
            cells += paper_cells(row.get("paper"))
        lines.append(md_row(cells))
    if marked:
        lines += ["", *(f"- [{n}] `{c}`: {outside[c]}" for n, c in enumerate(marked, start=1))]
    return lines


def development_seed(runs: dict[str, dict], seed_study: dict | None, chose: dict[str, int]) -> str:
    """Which seed chose the settings (``chose``: each choice's file and the seed it ran
    with) against the tables' own, and how the tables' seed's average compares with the
    mean of the study's other seeds."""
    own = sorted({m.seed for m in runs.values()})
    if not own:
        return ""
    same = [f"`{name}`" for name, seed in chose.items() if seed in own]
    said = f"The tables' runs use seed {', '.join(map(str, own))}"
    if same:
        said += f", the seed the choices of {', '.join(same)} were made with"
        said += ": theirs are the development seed's numbers"
    configs = seed_study.configs if seed_study else {}
    # Each configuration's average by seed, the tables' own from their runs.
    by_seed = {
        c: {**{r.seed: r.scores[AVERAGE] for r in rows}, runs[c].seed: runs[c].scores[AVERAGE]}
        for c, rows in configs.items()
        if c in runs and any(r.seed not in own for r in rows)
    }
    if by_seed and len(own) == 1:
        seeds = sorted(set.intersection(*(set(scores) for scores in by_seed.values())))
        # Every configuration has the tables' seed (its run), so it is among ``seeds``.
        leads = {s: _lead(by_seed, s) for s in seeds}
        above = sum(_gap(scores, own[0]) > 0 for scores in by_seed.values())
        others = ", ".join(f"{s} {leads[s]:+.3f}" for s in seeds if s != own[0])
        said += (
            f". Its average is above the other seeds' mean in {above} of {len(by_seed)} "
            f"configurations ({leads[own[0]]:+.3f} on average); each other seed against the rest, "
            f"the same way: {others}: Tables 2-4 below give the mean over seeds"
        )
    return said + "."


def _gap(scores: dict[int, float], seed: int) -> float:
    """A configuration's average with ``seed`` minus the mean of its other seeds'."""
    return scores[seed] - statistics.mean(v for s, v in scores.items() if s != seed)


def _lead(by_seed: dict[str, dict[int, float]], seed: int) -> float:
    """``seed``'s gap (:func:`_gap`) averaged over the configurations."""
    return statistics.mean(_gap(scores, seed) for scores in by_seed.values())


@dataclass(frozen=True)
class GpuColumns:
    """What the first page's tables show of the `gpu` scale: its runs, their judged
    comparisons, its zero-shot, the evidence they recompute from, and the stale stages."""

    runs: dict[str, dict]
    judged: list[Compared]
    zero_shot: dict | None
    evidence: Evidence
    stale: dict[str, list[str]]


def whole_report(out_dir: Path) -> str:
    """The report's pages as one text, its first page first: what a test reads."""
    names = ["README.md", *(name for name in PAGES if (Path(out_dir) / name).is_file())]
    return "\n".join((Path(out_dir) / name).read_text(encoding="utf-8") for name in names)
