"""Experiments side by side: ``dvc exp show --json`` turned into one narrow table per metric
(a row per run, a column per experiment, as many as fit, newest kept). A cell gives the
difference from the experiment's parent with a 95% paired bootstrap interval on both
runs' dev predictions (``~``: it includes zero); under the tables, the parameters each
experiment changed, and its runs that differ for another reason by ``dvc.lock``."""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.commits import git
from minbert.data.predictions import read_predictions
from minbert.metrics import CONFIDENCE, Interval, fixed, paired, paired_average, score
from minbert.results import ACCURACY, EPOCH, STEPS, is_record, metrics_from_text
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS
from minbert.tools.sweep import DVC, flatten_params, lock_stages

# The metrics a comparison shows by default, with their titles.
TITLES = {
    **{t: TASKS[t].metric_title for t in MULTITASK_TASKS},
    AVERAGE: "Average",
    ACCURACY: "Accuracy (sentiment: dev; MLM: held-out masked tokens)",
    EPOCH: "Epoch chosen",
    STEPS: "Optimizer steps",
}
DEFAULT_METRICS = (*MULTITASK_TASKS, AVERAGE, ACCURACY)
# Where a run's dev predictions and the dev labels are (a multitask-style run's).
PREDICTIONS = "predictions/{run}/{task}-dev-out.csv"
LABELS = "data/prepared/{task}-dev.parquet"
# The `resolve` stage's outputs: each stage's share of params.yaml.
SETTINGS = "data/settings/"
WORKSPACE = "workspace"
LEGEND = (
    "Each experiment's difference from its parent (its baseline commit; HEAD for the workspace), "
    f"with a paired {CONFIDENCE:.0%} bootstrap interval over the dev examples where both runs' "
    "predictions are at hand; ~: the interval includes 0, no clear difference."
)


@dataclass(frozen=True)
class Experiment:
    name: str
    rev: str  # a commit, or "workspace"
    parent: str | None  # the experiment it is compared with: its baseline (HEAD for the workspace)
    params: dict[str, object]  # flattened: "configs.best.optimizer" -> value
    metrics: dict[str, dict]  # "multitask/best" -> the metrics file's numbers


@dataclass(frozen=True)
class Difference:
    value: float
    interval: Interval | None  # None: no predictions to pair
    why: str | None = None  # why a difference that could be paired has no interval


# The runs' metrics files (records and other folders' copies apart), read at each
# revision from git or the workspace, whatever `dvc exp show` could collect.
RUN_METRICS = ("metrics/sentiment/", "metrics/multitask/", "metrics/multitask-mlm/", "metrics/mlm/")
UNTRAINED = "metrics/zero-shot.json"


def run_metrics(repo: Path, rev: str) -> dict[str, dict[str, float]]:
    """Every run's metrics file at ``rev`` (a commit, or the workspace), by run:
    ``multitask/best`` -> its numbers."""
    repo = Path(repo)
    if rev == WORKSPACE:
        names = [p.relative_to(repo).as_posix() for p in sorted((repo / "metrics").rglob("*.json"))]
    else:
        listing = ["git", "ls-tree", "-r", "--name-only", rev, "--", "metrics"]
        listed = subprocess.run(listing, cwd=repo, capture_output=True, text=True)
        names = listed.stdout.splitlines() if listed.returncode == 0 else []
    stages = lock_stages(repo, None if rev == WORKSPACE else rev)
    made = None if stages is None else {o["path"] for s in stages.values() for o in s.get("outs") or []}
    out = {}
    for name in names:
        if not name.endswith(".json") or not (name.startswith(RUN_METRICS) or name == UNTRAINED):
            continue
        if is_record(name) or (made is not None and name not in made):
            continue  # a record, or a run no stage of its dvc.lock made (`minbert extra-runs`)
        text = (
            (repo / name).read_text(encoding="utf-8")
            if rev == WORKSPACE
            else git(repo, "show", f"{rev}:{name}")
        )
        source = name if rev == WORKSPACE else f"{rev[:7]}:{name}"
        out[name[len("metrics/") : -len(".json")]] = metrics_from_text(text, source)
    return out


def _experiment(name: str, rev: str, parent: str | None, data: dict, repo: Path) -> Experiment:
    params = {}
    for content in (data.get("params") or {}).values():
        params.update(flatten_params(content.get("data") or {}))
    return Experiment(name, rev, parent, params, run_metrics(repo, rev))


def parse_exp_show(rows: list[dict], repo: Path) -> list[Experiment]:
    """The experiments of ``dvc exp show --json`` (the workspace, each baseline commit,
    then its experiments), each with its runs' metrics files as ``repo`` holds them."""

    def name(row):
        return WORKSPACE if row["rev"] == WORKSPACE else row.get("name") or row["rev"][:7]

    head = next((name(r) for r in rows if r["rev"] != WORKSPACE and r.get("data")), None)
    out = []
    for row in rows:
        if row.get("data"):
            parent = head if name(row) == WORKSPACE else None
            out.append(_experiment(name(row), row["rev"], parent, row["data"], repo))
        for group in row.get("experiments") or []:
            for rev in group.get("revs") or []:
                if rev.get("data"):
                    out.append(_experiment(name(rev), rev["rev"], name(row), rev["data"], repo))
    return out


def exp_show(repo: Path) -> list[Experiment]:
    done = subprocess.run([*DVC, "exp", "show", "--json"], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"dvc exp show failed in {repo}: {' '.join(done.stderr.split())}")
    return parse_exp_show(json.loads(done.stdout), repo)


def changed_params(experiment: Experiment, parent: Experiment) -> dict[str, object]:
    """The parameters whose value differs from the parent's (None: removed)."""
    base = parent.params
    return {k: v for k, v in experiment.params.items() if base.get(k) != v} | {
        k: None for k in base if k not in experiment.params
    }


class Files:
    """The repository's files in the workspace or at a commit (git- or DVC-tracked, the
    latter from DVC's cache); None for one that is not there, and why (``missing``)."""

    def __init__(self, repo: Path, scratch: Path):
        self.repo, self.scratch = Path(repo), Path(scratch)
        self._fs: dict[str, object] = {}
        self.missing: dict[tuple[str, str], str] = {}  # (rev, path) -> why it is not here

    def get(self, rev: str, path: str) -> Path | None:
        if rev == WORKSPACE:
            if (self.repo / path).is_file():
                return self.repo / path
            self.missing[rev, path] = "not in the workspace: `dvc repro` writes it"
            return None
        from dvc.api import DVCFileSystem

        local = self.scratch / rev / path
        if not local.is_file():
            try:
                if rev not in self._fs:
                    self._fs[rev] = DVCFileSystem(str(self.repo), rev=rev)
                local.parent.mkdir(parents=True, exist_ok=True)
                self._fs[rev].get_file(path, str(local))
            except Exception as error:  # DVC has many kinds for an object missing from its cache
                self.missing[rev, path] = (
                    f"not in this clone's DVC cache ({type(error).__name__}): results are cached "
                    "where `dvc repro` made them; commit them there, or `dvc push` them to a DVC "
                    "remote and `dvc pull` here"
                )
                return None
        return local

    def lock(self, rev: str) -> dict[str, dict]:
        """``dvc.lock``'s stages by the outputs they write."""
        stages = lock_stages(self.repo, None if rev == WORKSPACE else rev) or {}
        return {out["path"]: stage for stage in stages.values() for out in stage.get("outs") or []}


def _dev(files: Files, experiment: Experiment, run: str, task: str):
    """(labels, predictions, question groups) of ``run``'s dev predictions of ``task`` at
    ``experiment``, or why not: they are missing, or do not score what its metrics file
    says (other labels, or results from another run)."""
    labels_file = files.get(experiment.rev, LABELS.format(task=task))
    predicted_file = files.get(experiment.rev, PREDICTIONS.format(run=run, task=task))
    if labels_file is None or predicted_file is None:
        return f"{experiment.name} has no {'dev labels' if labels_file is None else 'dev predictions'}"
    table, predicted = pd.read_parquet(labels_file), read_predictions(predicted_file)
    ids = table["id"].astype(str)
    if set(ids) != set(predicted):
        return f"{experiment.name}'s dev predictions are of other examples than its labels"
    labels = table["label"].to_numpy(float)
    predictions = np.array([float(predicted[i]) for i in ids])
    if fixed(score(task, labels, predictions)) != experiment.metrics[run].get(task):
        return f"{experiment.name}'s dev predictions do not score what its metrics file says"
    return labels, predictions, table["group"].to_numpy() if "group" in table else None


def paired_interval(
    files: Files, experiment: Experiment, parent: Experiment, run: str, metric: str
) -> tuple[Interval | None, str | None]:
    """The paired bootstrap interval of ``run``'s ``metric`` (a task's, or the average)
    between ``experiment`` and ``parent``, or why there is none."""
    parts = []
    for task in MULTITASK_TASKS if metric == AVERAGE else (metric,):
        ours, theirs = _dev(files, experiment, run, task), _dev(files, parent, run, task)
        for found in (ours, theirs):
            if isinstance(found, str):
                return None, found
        if not np.array_equal(ours[0], theirs[0]):
            return None, f"{experiment.name} and {parent.name} have other dev labels"
        parts.append((task, ours[0], ours[1], theirs[1], ours[2]))
    if metric == AVERAGE:
        return paired_average(parts), None
    task, labels, predictions, reference, groups = parts[0]
    return paired(task, labels, predictions, reference, groups=groups), None


def differences(experiments: list[Experiment], metrics, files: Files) -> dict[tuple, Difference]:
    """(experiment, run, metric) -> the difference from the parent's run, with its
    interval where it is not zero and the predictions are at hand."""
    from minbert.progress import progress

    by_name = {e.name: e for e in experiments}
    todo = []
    for e in experiments:
        parent = by_name.get(e.parent)
        for run, numbers in e.metrics.items() if parent else ():
            for metric in metrics:
                ours, theirs = numbers.get(metric), parent.metrics.get(run, {}).get(metric)
                if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
                    todo.append((e, parent, run, metric, ours - theirs))
    out = {}
    with progress(quiet=not todo) as bar:
        job = bar.add_task("paired intervals", total=len(todo), status="")
        for e, parent, run, metric, value in todo:
            pairable = value and metric in (*MULTITASK_TASKS, AVERAGE)
            interval, why = paired_interval(files, e, parent, run, metric) if pairable else (None, None)
            out[e.name, run, metric] = Difference(value, interval, why)
            bar.advance(job)
    return out


def other_reasons(files: Files, experiment: Experiment, parent: Experiment) -> list[str]:
    """The experiment's runs whose numbers differ from the parent's for a reason other
    than params, by the stages that wrote them in ``dvc.lock``: the same inputs (a
    rebuild), or changed ones (code, data) other than the settings params reach."""
    ours, theirs = files.lock(experiment.rev), files.lock(parent.rev)
    rebuilt, changed, unrecorded = [], [], []
    for run, numbers in sorted(experiment.metrics.items()):
        path = f"metrics/{run}.json"
        if (
            run not in parent.metrics
            or numbers == parent.metrics[run]
            or path not in ours
            or path not in theirs
        ):
            continue
        deps = [
            {d["path"]: d.get("md5") for d in stage.get("deps") or []} for stage in (ours[path], theirs[path])
        ]
        moved = sorted(p for p in deps[0].keys() | deps[1].keys() if deps[0].get(p) != deps[1].get(p))
        if ours[path].get("params") != theirs[path].get("params") or any(
            p.startswith(SETTINGS) for p in moved
        ):
            continue  # its share of the params changed
        written = [
            {o["path"]: o.get("md5") for o in stage["outs"]}[path] for stage in (ours[path], theirs[path])
        ]
        if moved:
            changed.append(f"{run} ({', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''})")
        else:
            (rebuilt if written[0] != written[1] else unrecorded).append(run)
    lines = []
    if unrecorded:
        lines.append(f"  other numbers than dvc.lock records (see `dvc status`): {', '.join(unrecorded)}")
    if rebuilt:
        lines.append(f"  same inputs, other numbers (rebuilt, e.g. on another CPU): {', '.join(rebuilt)}")
    if changed:
        lines.append(f"  changed inputs other than params: {'; '.join(changed)}")
    return lines


def without_interval(
    found: dict[tuple, Difference], files: Files, experiments: list[Experiment]
) -> list[str]:
    """Why a difference shows no interval, a line per experiment and run; then each file
    found missing, with how to get it."""
    why = {}
    for (name, run, _), difference in found.items():
        if difference.why:
            why.setdefault((name, run), difference.why)
    lines = [f"no interval for {run} in {name}: {reason}" for (name, run), reason in why.items()]
    names, missing = {e.rev: e.name for e in experiments}, {}
    for (rev, path), reason in files.missing.items():  # a line per folder
        missing.setdefault((names.get(rev, rev[:7]), Path(path).parent.as_posix()), reason)
    return lines + [f"missing: {folder}/ at {name}: {reason}" for (name, folder), reason in missing.items()]


def cell(value, difference: Difference | None) -> str:
    text = "—" if value is None else f"{value:g}" if isinstance(value, int) else f"{value:.4f}"
    if difference is None or not difference.value:
        return text
    if isinstance(difference.value, int):
        return f"{text} {difference.value:+d}"
    text = f"{text} {difference.value:+.3f}"
    interval = difference.interval
    if interval is None:
        return text
    return f"{text} [{interval.low:+.3f}, {interval.high:+.3f}]{'' if interval.excludes_zero else ' ~'}"


def table_rows(experiments: list[Experiment], metric: str, found: dict | None = None) -> list[list[str]]:
    """A row per run that has ``metric`` in some experiment: the run, then its values
    (with their differences from the parent's, from ``found``)."""
    runs = sorted({r for e in experiments for r, numbers in e.metrics.items() if metric in numbers})
    found = found or {}
    return [
        [
            run,
            *(
                cell(e.metrics.get(run, {}).get(metric), found.get((e.name, run, metric)))
                for e in experiments
            ),
        ]
        for run in runs
    ]


def fitting(experiments: list[Experiment], width: int) -> list[Experiment]:
    """The experiments whose columns fit ``width`` characters beside the run column:
    the baseline, then the workspace when it differs from it (uncommitted results),
    then the newest experiments. A column with differences is wide, a baseline's narrow."""
    if len(experiments) > 1 and experiments[0].name == WORKSPACE:
        workspace, base = experiments[0], experiments[1]
        if (workspace.params, workspace.metrics) == (base.params, base.metrics):
            experiments = experiments[1:]
    experiments = [e for e in experiments if e.parent is None] + [e for e in experiments if e.parent]
    runs = [run for e in experiments for run in e.metrics]
    used = 4 + max(map(len, runs), default=3)  # the run column, the table's borders
    shown = []
    for e in experiments:
        used += 35 if e.parent else 9
        if used > width and shown:
            break
        shown.append(e)
    return shown


def print_comparison(repo: Path, metrics: list[str] | None = None) -> None:
    """The tables of ``metrics`` (default ``DEFAULT_METRICS``) on stdout, as wide as the
    terminal, then what each experiment changed."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = Console()  # stdout: the command's result
    experiments = fitting(exp_show(repo), out.width)
    if not experiments:
        raise FileNotFoundError(f"{repo}: no experiments or results to compare (run `dvc repro` first)")
    metrics = list(metrics or DEFAULT_METRICS)
    by_name = {e.name: e for e in experiments}
    with tempfile.TemporaryDirectory() as scratch:
        files = Files(repo, Path(scratch))
        found = differences(experiments, metrics, files)
        for key in metrics:
            rows = table_rows(experiments, key, found)
            if not rows:
                continue
            table = Table(title=TITLES.get(key, key), title_justify="left")
            table.add_column("run")
            for e in experiments:
                table.add_column(
                    e.name if e.parent is None else f"{e.name} (Δ from {e.parent})", justify="right"
                )
            for row in rows:
                table.add_row(*map(escape, row))
            out.print(table)
        out.print(LEGEND, highlight=False)
        for line in without_interval(found, files, experiments):
            out.print(escape(line), highlight=False)
        for e in experiments:
            parent = by_name.get(e.parent)
            if parent is None:
                continue
            changed = changed_params(e, parent)
            said = ", ".join(f"{k}={v}" for k, v in sorted(changed.items())) or "none"
            out.print(escape(f"{e.name} vs {parent.name}: params changed: {said}"), highlight=False)
            for line in other_reasons(files, e, parent):
                out.print(escape(line), highlight=False)
