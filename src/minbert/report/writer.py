"""The report: every comparison of Tables 2-4 computed and judged once, then its pages.
The first (README.md) holds the summary (what ran, each comparison's verdict) and Tables 1-4
beside the paper's and the GPU's; the others (``PAGES``) hold setup and findings, the full
tables, controls and starts, the budget, choices, seeds, MLM, the GPU study, figures, provenance."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from minbert.atomic import atomic_directory
from minbert.gpu_study import changed_code
from minbert.metrics import Resamples
from minbert.report.comparisons import interval_note, level, seed_runs
from minbert.report.controls import controls_section, starts_section
from minbert.report.counted_runs import load_runs, mlm_runs
from minbert.report.detectable import detectable_section
from minbert.report.evidence import Evidence
from minbert.report.family_rates import family_search_section
from minbert.report.figures import FIGURE_KINDS, figure_section, figures_source
from minbert.report.findings import findings_section
from minbert.report.first_page import (
    PAGES,
    READING_NOTE,
    GpuColumns,
    compact_table,
    compact_table1,
    development_seed,
)
from minbert.report.gpu import GPU_METRICS, GPU_PREDICTIONS, GPU_ROOT, GpuStudy, gpu_comparisons, gpu_section
from minbert.report.notes import ablation_parents, fill_facts, paper_best, with_facts
from minbert.report.outside_repro import extra_runs
from minbert.report.plots import write_plot_tables
from minbert.report.pretraining import mlm_section, tuned_name
from minbert.report.provenance import cross_cpu_section, provenance_section, setup_section
from minbert.report.smart_page import smart_page
from minbert.report.studies import choice_seeds, result_seeds, seed_section, selection_section
from minbert.report.summary import beside_the_paper, what_it_can_show
from minbert.report.tables import arm_ends, judged_comparisons, multitask_table, other_spec, table1
from minbert.report.warmup_cap import warmup_cap_section
from minbert.runs.gpu_calls import PROVENANCE_FILE, read_gpu_provenance
from minbert.runs.study_files import (
    LR_SEARCH_FILE,
    SEED_STUDY_FILE,
    read_family_search,
    read_seed_study,
)
from minbert.runs.training import (
    SentimentRunFile,
    ZeroShotRunFile,
    file_parts,
    read_run,
    read_runs,
)

MULTITASK_TABLES = ["table2", "table3", "table4"]
ZERO_SHOT_FILE = "zero-shot.json"
BUDGET_NOTE = (
    "Steps / examples: the optimizer steps over all epochs, and the training examples "
    "consumed over all epochs, all tasks together (per task: provenance.md)."
)


def gpu_study(
    metrics_dir: Path, prepared_dir: Path, sources: Path, resamples: Resamples | None = None
) -> GpuStudy | None:
    """The `gpu` scale's study that ``minbert gpu-unpack`` gathered under
    ``metrics/gpu`` (its own metrics/ and predictions/), with the code each stage ran with
    compared to ``sources``' (the repository root), or None before the first call;
    ``resamples``: the bootstrap draws it shares (the dev sets are the same)."""
    if not (metrics_dir / GPU_ROOT / PROVENANCE_FILE).is_file():
        return None
    runs = metrics_dir / GPU_METRICS
    zero_shot = runs / ZERO_SHOT_FILE
    provenance = read_gpu_provenance(metrics_dir / GPU_ROOT)
    return GpuStudy(
        sentiment=read_runs(SentimentRunFile, runs / "sentiment"),
        multitask={m.config: m for m in load_runs(runs / "multitask")},
        zero_shot=read_run(ZeroShotRunFile, zero_shot) if zero_shot.is_file() else None,
        provenance=provenance,
        # The dev sets are the same at every scale: this machine's prepared labels; every
        # number is recomputed from the node's predictions and must equal its metrics file's.
        evidence=Evidence(metrics_dir / GPU_PREDICTIONS, prepared_dir, resamples),
        stale=changed_code(provenance, sources),
        multitask_dir=runs / "multitask",
    )


def _optional_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def check_paper(paper: dict) -> None:
    """Fail early, naming the entry, on a paper.yaml the report cannot read."""
    if "setup" not in paper:
        raise ValueError("paper.yaml: needs `setup` (the paper's setting, for the setup table)")
    for name in MULTITASK_TABLES:
        if name in paper and "parent" not in paper[name]:
            raise ValueError(f"paper.yaml {name}: needs `parent` (the configuration rows are compared with)")
        for i, row in enumerate(paper.get(name, {}).get("rows", [])):
            if not isinstance(row, dict) or "config" not in row or "label" not in row:
                raise ValueError(f"paper.yaml {name}.rows[{i}]: needs `config` and `label`")
    for i, spec in enumerate(paper.get("figures", [])):
        if spec.get("kind") not in FIGURE_KINDS:
            raise ValueError(f"paper.yaml figures[{i}]: kind must be one of {', '.join(FIGURE_KINDS)}")
        for key in ("file", "title", "caption", "configs"):
            if key not in spec:
                raise ValueError(f"paper.yaml figures[{i}]: missing `{key}`")


def write_report(
    metrics_dir: Path,
    predictions_dir: Path,
    prepared_dir: Path,
    paper_file: Path,
    out_dir: Path,
    params_file: Path | None = None,
    smart_file: Path | None = None,
    smart_norm_file: Path | None = None,
    cross_cpu_file: Path | None = None,
    warmup_cap_file: Path | None = None,
    sources: Path = Path("."),
    size_choice_files: list[Path] = (),
) -> None:
    """README.md, its figures and the plots' tables under ``out_dir``; ``params_file`` gives
    the scales not run, ``smart_file``, ``smart_norm_file``, ``cross_cpu_file`` and
    ``warmup_cap_file`` the results of ``bench/``'s ``smart_collapse.py``, ``smart_norm.py``,
    ``cross_cpu.py`` and ``warmup_cap.py``; ``sources``: the repository root, whose code the GPU
    results are compared with; ``size_choice_files``: benchmarks' results that chose sizes."""
    metrics_dir = Path(metrics_dir)
    paper = yaml.safe_load(Path(paper_file).read_text(encoding="utf-8"))
    check_paper(paper)
    params = yaml.safe_load(Path(params_file).read_text(encoding="utf-8")) if params_file else None
    sentiment = read_runs(SentimentRunFile, metrics_dir / "sentiment")
    multitask_dir = metrics_dir / "multitask"
    extra = extra_runs(load_runs(multitask_dir), params, metrics_dir, sources)  # `dvc repro` leaves some out
    multitask, evidence = extra.counted, Evidence(predictions_dir, prepared_dir, elsewhere=extra.predictions)
    outside = extra.notes()  # the note of each row `dvc repro` does not run
    if not sentiment and not multitask:
        raise FileNotFoundError(
            f"no metrics files to report: neither {metrics_dir}/sentiment nor {multitask_dir} "
            "holds any run (run the `sentiment` or `multitask` stages first)"
        )
    zero_shot_file = metrics_dir / ZERO_SHOT_FILE
    zero_shot = read_run(ZeroShotRunFile, zero_shot_file) if zero_shot_file.is_file() else None
    seed_study = seed_runs(read_seed_study(metrics_dir / SEED_STUDY_FILE), multitask, zero_shot)
    lr_search = read_family_search(metrics_dir / LR_SEARCH_FILE)
    smart_lines, smart_seeds = smart_page(smart_file, smart_norm_file, multitask)
    mlm = mlm_runs(metrics_dir, sources)

    specs = {
        name: with_facts(paper[name], multitask, multitask_dir) for name in MULTITASK_TABLES if name in paper
    }
    shown = {row["config"] for spec in specs.values() for row in spec["rows"]}
    others = other_spec(shown, multitask, paper["table2"]["parent"])
    # Every comparison once, judged within its family, before any page renders it.
    compared = judged_comparisons(
        [*specs.values(), *([others] if others else [])], multitask, evidence, seed_study
    )
    tables = []
    for number, name in enumerate(MULTITASK_TABLES, start=2):
        if name in specs:
            text, _ = multitask_table(
                specs[name], multitask, evidence, zero_shot, seed_study, outside, compared
            )
            tables += [f"## Table {number} in full: {paper[name]['title']}", "", text, ""]
    if others:
        text, _ = multitask_table(others, multitask, evidence, seed_study=seed_study, judged=compared)
        tables += [
            "## Other configurations",
            "",
            "Configurations of `configs` that no table of the paper shows.",
            "",
            text,
            "",
        ]
    in_tables = {
        (row["config"], spec["parent"])
        for spec in specs.values()
        for row in spec["rows"]
        if row["config"] != spec["parent"]
    }
    table_compared = [c for c in compared if (c.name, c.parent) in in_tables]
    controls = controls_section(multitask, sentiment, evidence, multitask_dir)
    starts = starts_section(multitask, zero_shot, evidence, seed_study)

    on_gpu = gpu_study(metrics_dir, Path(prepared_dir), Path(sources), evidence.resamples)
    gpu_compared = gpu_comparisons(on_gpu, paper, MULTITASK_TABLES) if on_gpu else []
    ends = arm_ends(sentiment, metrics_dir / "sentiment")
    gpu_columns = (
        GpuColumns(on_gpu.multitask, gpu_compared, on_gpu.zero_shot, on_gpu.evidence, on_gpu.stale)
        if on_gpu and on_gpu.multitask
        else None
    )
    _, summary_prose = beside_the_paper(
        multitask,
        sentiment,
        paper,
        *((on_gpu.multitask, on_gpu.sentiment, on_gpu.provenance, on_gpu.stale) if on_gpu else (None,) * 4),
        seed_study=seed_study,
    )
    first = [
        "# minbert results",
        "",
        "Generated by `dvc repro` (stage `report`) from the metrics files and run records under",
        "`metrics/` and the dev predictions under `predictions/`; do not edit by hand. Published",
        f"numbers: {paper['paper'].strip()}",
        "",
        "## Summary",
        "",
        summary_prose,
        "",
        what_it_can_show(table_compared, starts),
        "",
        development_seed(
            multitask,
            seed_study,
            choice_seeds(
                {
                    (metrics_dir / LR_SEARCH_FILE).as_posix(): {p.seed for p in lr_search.points}
                    if lr_search
                    else set(),
                    **smart_seeds,
                    **result_seeds({Path(f).as_posix(): _optional_json(Path(f)) for f in size_choice_files}),
                }
            ),
        ),
        "",
        READING_NOTE.format(level=level()),
        "",
        f"## Table 1: {paper['table1']['title']}",
        "",
        *compact_table1(
            sentiment,
            paper["table1"],
            evidence,
            *((on_gpu.sentiment, on_gpu.stale, on_gpu.evidence) if on_gpu else (None, None, None)),
            ends,
        ),
        "",
    ]
    for number, name in enumerate(MULTITASK_TABLES, start=2):
        if name in specs:
            first += [
                f"## Table {number}: {paper[name]['title']}",
                "",
                *compact_table(
                    specs[name], multitask, evidence, compared, zero_shot, gpu_columns, seed_study, outside
                ),
                "",
            ]
    pages = {
        "findings.md": [
            "## Setup at a glance",
            "",
            *setup_section(multitask, sentiment, seed_study, paper["setup"]),
            "",
            "## Findings",
            "",
            *findings_section(
                multitask,
                zero_shot,
                evidence,
                seed_study,
                table_compared,
                controls.missed,
                controls.checked,
                starts,
                paper_best(paper),
                paper["setup"]["summary"],
            ),
            "",
        ],
        "tables.md": [
            "## How to read the tables",
            "",
            interval_note("its parent (the row marked (parent))"),
            "",
            BUDGET_NOTE,
            "",
            f"## Table 1 in full: {paper['table1']['title']}",
            "",
            table1(sentiment, paper["table1"], evidence, ends=ends),
            "",
            *tables,
        ],
        "controls.md": [
            "## Controls: what each number is measured against",
            "",
            controls.text,
            "",
            "## Against where each run started",
            "",
            starts.text,
            "",
        ],
        "budget.md": [
            "## What this budget can and cannot detect",
            "",
            *detectable_section(table_compared, multitask, multitask_dir),
            "",
        ],
        "choices.md": [],
        "seeds.md": [
            "## Seed study",
            "",
            seed_section(seed_study, ablation_parents(paper, MULTITASK_TABLES), multitask, compared),
            "",
        ],
        "mlm.md": ["## MLM pretraining before fine-tuning", "", mlm_section(mlm, multitask, evidence), ""],
        "gpu.md": [
            "## On a GPU: the `gpu` scale",
            "",
            *gpu_section(on_gpu, paper, MULTITASK_TABLES, gpu_compared),
            "",
        ],
    }
    if smart_lines:
        pages["smart.md"] = smart_lines
    if paper.get("choices"):
        pages["choices.md"] += [
            "## Where the paper is silent, and what this pipeline chose",
            "",
            *(f"- {fill_facts(choice.strip(), multitask, multitask_dir)}" for choice in paper["choices"]),
            "",
            *warmup_cap_section(warmup_cap_file, multitask, multitask_dir),
        ]
    pages["choices.md"] += [
        "## What chose what",
        "",
        selection_section(
            multitask,
            sentiment,
            params,
            lr_search,
            paper.get("learning_rates", {}),
        ),
        "",
        *family_search_section(lr_search, multitask),
        "",
    ]
    with atomic_directory(out_dir) as tmp:
        if paper.get("figures"):
            figures = []
            # Shown as given (e.g. metrics/multitask), so the report names the files
            # as the repository does and does not depend on where it was built.
            display_dir = multitask_dir.as_posix()
            for spec in paper["figures"]:
                figures += [figure_section(spec, multitask_dir, display_dir, tmp), ""]
            pages["figures.md"] = ["## Figures", "", figures_source(multitask, display_dir), "", *figures]
        named = {**multitask, **{tuned_name(m): m for m in mlm.tuned}}
        how = provenance_section(named, sentiment)
        pages["provenance.md"] = ["## How each number was produced", "", *how, "", *extra.lines()]
        if cross_cpu_file is not None:
            numbers = {c: file_parts(m)[0] for c, m in multitask.items()}  # the metrics files
            source = Path(cross_cpu_file)
            across = cross_cpu_section(_optional_json(source), source.as_posix(), numbers)
            pages["provenance.md"] += ["### Across CPUs", "", across, ""]
        first += ["## The rest of the report", ""]
        first += [f"- [{PAGES[name]}]({name})" for name in PAGES if name in pages]
        first += [""]
        for name, lines in pages.items():
            head = [f"# minbert results: {PAGES[name]}", "", "[The results' first page](README.md).", ""]
            (tmp / name).write_text("\n".join(head + lines), encoding="utf-8")
        write_plot_tables(metrics_dir, tmp / "plots")
        (tmp / "README.md").write_text("\n".join(first), encoding="utf-8")
