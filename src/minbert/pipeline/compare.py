"""Experiments side by side: ``dvc exp show --json`` as one narrow table per metric.

``dvc exp show`` puts every metric of every metrics file and every parameter in one
row per experiment: with a dozen configurations that is hundreds of columns. Here the
same data is turned around: one table per metric (each task's score, the average),
a row per run (``multitask/best``, ...), a column per experiment, and under the
tables the parameters each experiment changed. A table holds as many experiment
columns as fit the width asked for; the newest experiments are kept.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from minbert.pipeline.sweep import DVC, flatten_params
from minbert.results import ACCURACY, EPOCH, STEPS
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS

# The metrics a comparison shows by default, with their titles.
TITLES = {
    **{t: TASKS[t].metric_title for t in MULTITASK_TASKS},
    AVERAGE: "Average",
    ACCURACY: "Accuracy (sentiment: dev; MLM: held-out masked tokens)",
    EPOCH: "Epoch chosen",
    STEPS: "Optimizer steps",
}
DEFAULT_METRICS = (*MULTITASK_TASKS, AVERAGE, ACCURACY)


@dataclass(frozen=True)
class Experiment:
    name: str
    params: dict[str, object]  # flattened: "configs.best.optimizer" -> value
    metrics: dict[str, dict]  # "multitask/best" -> the metrics file's numbers


def _experiment(name: str, data: dict) -> Experiment:
    params = {}
    for content in (data.get("params") or {}).values():
        params.update(flatten_params(content.get("data") or {}))
    metrics = {}
    for path, content in (data.get("metrics") or {}).items():
        run = path[len("metrics/") :] if path.startswith("metrics/") else path
        metrics[run[: -len(".json")] if run.endswith(".json") else run] = content.get("data") or {}
    return Experiment(name, params, metrics)


def parse_exp_show(rows: list[dict]) -> list[Experiment]:
    """The experiments of ``dvc exp show --json``: the workspace, each baseline commit,
    then its experiments."""
    out = []
    for row in rows:
        if row.get("data"):
            name = "workspace" if row["rev"] == "workspace" else row.get("name") or row["rev"][:7]
            out.append(_experiment(name, row["data"]))
        for group in row.get("experiments") or []:
            for rev in group.get("revs") or []:
                if rev.get("data"):
                    out.append(_experiment(rev.get("name") or rev["rev"][:7], rev["data"]))
    return out


def exp_show(repo: Path) -> list[Experiment]:
    done = subprocess.run([*DVC, "exp", "show", "--json"], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"dvc exp show failed in {repo}: {done.stderr.strip()}")
    return parse_exp_show(json.loads(done.stdout))


def changed_params(experiments: list[Experiment]) -> dict[str, dict[str, object]]:
    """Per experiment, the parameters whose value differs from the first baseline
    commit's (the workspace's against it too)."""
    if not experiments:
        return {}
    base = next((e for e in experiments if e.name != "workspace"), experiments[0]).params
    return {
        e.name: {k: v for k, v in e.params.items() if base.get(k) != v}
        | {k: None for k in base if k not in e.params}
        for e in experiments
    }


def table_rows(experiments: list[Experiment], metric: str) -> list[list[str]]:
    """A row per run that has ``metric`` in some experiment: the run, then its values."""
    runs = sorted({r for e in experiments for r, numbers in e.metrics.items() if metric in numbers})
    rows = []
    for run in runs:
        cells = []
        for e in experiments:
            value = e.metrics.get(run, {}).get(metric)
            cells.append("—" if value is None else f"{value:g}" if isinstance(value, int) else f"{value:.4f}")
        rows.append([run, *cells])
    return rows


def fitting(
    experiments: list[Experiment], width: int, run_width: int = 34, column_width: int = 12
) -> list[Experiment]:
    """The experiments whose columns fit ``width`` characters beside the run column, in
    ``dvc exp show``'s order (baseline, then its newest experiments); the workspace
    only when it differs from the baseline (uncommitted results)."""
    if len(experiments) > 1 and experiments[0].name == "workspace":
        workspace, base = experiments[0], experiments[1]
        if (workspace.params, workspace.metrics) == (base.params, base.metrics):
            experiments = experiments[1:]
    room = max(1, (width - run_width) // column_width)
    return experiments[:room]


def print_comparison(repo: Path, metrics: list[str] | None = None) -> None:
    """The tables of ``metrics`` (default ``DEFAULT_METRICS``) on stdout, as wide as the
    terminal, then the parameters each experiment changed."""
    from rich.console import Console
    from rich.table import Table

    out = Console()  # stdout: the command's result
    experiments = fitting(exp_show(repo), out.width)
    if not experiments:
        raise FileNotFoundError(f"{repo}: no experiments or results to compare (run `dvc repro` first)")
    for key in metrics or DEFAULT_METRICS:
        rows = table_rows(experiments, key)
        if not rows:
            continue
        table = Table(title=TITLES.get(key, key), title_justify="left")
        table.add_column("run")
        for e in experiments:
            table.add_column(e.name, justify="right")
        for row in rows:
            table.add_row(*row)
        out.print(table)
    for name, changed in changed_params(experiments).items():
        if changed:
            out.print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))
