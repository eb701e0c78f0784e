"""The report: the paper's tables and figures regenerated from this pipeline's outputs.

Every number in the report is read from a metrics file that a pipeline stage
wrote, with an interval bootstrapped from that stage's dev predictions
(``minbert.report.evidence``); the report says which checkpoint, data split,
seed, scale and device produced it, and sets the published numbers
(``reference/paper.yaml``) beside it.

What each table and figure shows (which configurations, in which order, with which
labels, compared with which parent) is data in ``reference/paper.yaml``, so adding
a row or a figure needs no change here. A configuration that was not run shows as
"not run" in a table, and a figure whose inputs are missing is replaced by a line
naming the missing files: a partial pipeline still gets a report. Only having no
metrics at all is an error, and so is a multitask metrics file without the keys the
tables read (``RUN_KEYS``): written before the stage recorded its training budget and
validation split, it has to be regenerated (``dvc repro``), not shown half-empty.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from minbert.atomic import atomic_directory
from minbert.report.controls import controls_section
from minbert.report.evidence import Evidence
from minbert.report.figures import FIGURE_KINDS, figure_section
from minbert.report.notes import fill_facts
from minbert.report.studies import mlm_section, seed_section, selection_section
from minbert.report.tables import multitask_table, table1

MULTITASK_TABLES = ["table2", "table3", "table4"]
SEED_STUDY_FILE = "seed-study.json"
ZERO_SHOT_FILE = "zero-shot.json"
LR_SEARCH_FILE = "lr-search.json"
# What every multitask metrics file must hold for the tables (besides the scores).
RUN_KEYS = ("optimizer_steps", "examples_seen", "validation_examples", "selection")


def load_metrics(directory: Path) -> list[dict]:
    # A directory that does not exist (stage never run) simply has no metrics.
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(directory).glob("*.json"))]


def load_runs(directory: Path) -> list[dict]:
    """A multitask stage's metrics files, each checked for ``RUN_KEYS`` (and SMART's
    measured terms when SMART was on)."""
    runs = []
    for path in sorted(Path(directory).glob("*.json")):
        m = json.loads(path.read_text(encoding="utf-8"))
        missing = [k for k in RUN_KEYS if k not in m]
        if m.get("settings", {}).get("smart") and "smart" not in m:
            missing.append("smart (SMART's adversarial term and its control)")
        if missing:
            raise ValueError(
                f"{path}: missing key(s) {', '.join(missing)}: written by an older `multitask` "
                "stage; rerun it (dvc repro)"
            )
        runs.append(m)
    return runs


def _optional_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _check_paper(paper: dict) -> None:
    """Fail early, naming the entry, on a paper.yaml the report cannot read."""
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


def ablation_parents(paper: dict) -> dict[str, str]:
    """Each configuration's ablation parent: that of the first multitask table that
    shows it as a row other than its parent (``best`` is compared with ``baseline``,
    Table 4's rows with ``best``)."""
    parents: dict[str, str] = {}
    for name in MULTITASK_TABLES:
        spec = paper.get(name, {})
        for row in spec.get("rows", []):
            if row["config"] != spec.get("parent"):
                parents.setdefault(row["config"], spec["parent"])
    return parents


def write_report(
    metrics_dir: Path,
    predictions_dir: Path,
    prepared_dir: Path,
    paper_file: Path,
    out_dir: Path,
    params_file: Path | None = None,
) -> None:
    """The report under ``out_dir``. ``params_file`` (params.yaml) gives the scales the
    runs were not made at, for "What chose what"; without it that section shows the
    runs' own scale only."""
    metrics_dir = Path(metrics_dir)
    paper = yaml.safe_load(Path(paper_file).read_text(encoding="utf-8"))
    _check_paper(paper)
    params = yaml.safe_load(Path(params_file).read_text(encoding="utf-8")) if params_file else None
    evidence = Evidence(predictions_dir, prepared_dir)
    sentiment = load_metrics(metrics_dir / "sentiment")
    multitask_dir = metrics_dir / "multitask"
    multitask = {m["config"]: m for m in load_runs(multitask_dir)}
    if not sentiment and not multitask:
        raise FileNotFoundError(
            f"no metrics files to report: neither {metrics_dir}/sentiment nor {multitask_dir} "
            "holds any *.json (run the `sentiment` or `multitask` stages first)"
        )
    zero_shot = _optional_json(metrics_dir / ZERO_SHOT_FILE)
    seed_study = _optional_json(metrics_dir / SEED_STUDY_FILE)

    sections = [
        "# minbert results",
        "",
        "Generated by `dvc repro` (stage `report`) from the files under `metrics/` and the",
        "dev predictions under `predictions/`; do not edit by hand. Published numbers:",
        paper["paper"].strip(),
        "",
        f"## Table 1: {paper['table1']['title']}",
        "",
        table1(sentiment, paper["table1"], evidence),
        "",
    ]
    for number, name in enumerate(MULTITASK_TABLES, start=2):
        if name in paper:
            sections += [
                f"## Table {number}: {paper[name]['title']}",
                "",
                multitask_table(paper[name], multitask, evidence, zero_shot, seed_study),
                "",
            ]
    sections += [
        "## Controls: what each number is measured against",
        "",
        controls_section(multitask, sentiment, zero_shot, evidence, multitask_dir),
        "",
    ]
    if paper.get("choices"):
        sections += [
            "## Where the paper is silent, and what this pipeline chose",
            "",
            *(f"- {fill_facts(choice.strip(), multitask, multitask_dir)}" for choice in paper["choices"]),
            "",
        ]
    sections += [
        "## What chose what",
        "",
        selection_section(
            multitask,
            params,
            _optional_json(metrics_dir / LR_SEARCH_FILE),
            paper.get("learning_rates", {}),
        ),
        "",
    ]
    pretraining = {m["start"]: m for m in load_metrics(metrics_dir / "mlm")}
    sections += [
        "## MLM pretraining before fine-tuning",
        "",
        mlm_section(pretraining, load_runs(metrics_dir / "multitask-mlm"), multitask, evidence),
        "",
        "## Seed study",
        "",
        seed_section(seed_study, ablation_parents(paper)),
        "",
    ]

    with atomic_directory(out_dir) as tmp:
        if paper.get("figures"):
            sections += ["## Figures", ""]
            # Shown as given (e.g. metrics/multitask), so the README names the files
            # as the repository does and does not depend on where it was built.
            display_dir = multitask_dir.as_posix()
            for spec in paper["figures"]:
                sections += [figure_section(spec, multitask_dir, display_dir, tmp), ""]
        (tmp / "README.md").write_text("\n".join(sections), encoding="utf-8")
