"""``minbert extra-runs``: the configurations `dvc repro` leaves out, run as one DVC
experiment and copied into the workspace (docs/experiments.md)."""

from __future__ import annotations

import json
from pathlib import Path

from minbert.commits import git
from minbert.results import CONFLICTS, HISTORY, RECORD_SUFFIX, STEP_LOSSES
from minbert.runs.study_files import EXTRA_RUNS_DIR, EXTRA_RUNS_FILE
from minbert.tasks import MULTITASK_TASKS
from minbert.tools.sweep import lock_stages, temp_experiment

COMMAND = "minbert extra-runs"
# A run's files under metrics/multitask/, by suffix after its name.
RUN_FILES = (".json", RECORD_SUFFIX, HISTORY, STEP_LOSSES, CONFLICTS)
# Its dev predictions: of the kept epoch, and of its start (the controls' evidence).
PREDICTIONS = ("dev", "dev-start")


def left_out(params: dict) -> list[str]:
    """The configurations of ``params`` that `dvc repro` does not run, in its order."""
    return [c for c in params["configs"] if c not in params["repro_configs"]]


def stage(config: str) -> str:
    return f"multitask@{config}"


def run_extra_runs(repo: Path) -> dict:
    """Train them as one experiment from the current commit (``--temp``), then keep them."""
    from minbert.pipeline.params import load

    configs = left_out(load(repo / "params.yaml"))
    if not configs:
        raise ValueError("params.yaml: repro_configs names every configuration; `dvc repro` runs them all")
    override = f"repro_configs=[{','.join(configs)}]"
    name, rev, how = temp_experiment(repo, "extra-runs", override, [stage(c) for c in configs])
    return keep(repo, rev, name, how, configs)


def keep_from(repo: Path, commit: str) -> dict:
    """Train nothing: keep the left-out configurations' runs as ``commit``'s `dvc repro` made them."""
    from minbert.pipeline.params import load

    rev = git(repo, "rev-parse", commit).strip()
    how = f"`dvc repro` at commit {rev[:7]}, whose repro_configs still named them"
    return keep(repo, rev, f"commit {rev[:7]}", how, left_out(load(repo / "params.yaml")))


def keep(repo: Path, rev: str, name: str, how: str, configs: list[str]) -> dict:
    """Copy the runs of ``configs`` at ``rev`` (whose dvc.lock has their stages) here."""
    from dvc.api import DVCFileSystem

    from minbert.atomic import atomic_write_text

    lock = lock_stages(repo, rev) or {}
    missing = [stage(c) for c in configs if stage(c) not in lock]
    if missing:
        raise ValueError(f"{rev[:7]}:dvc.lock has no stage {', '.join(missing)}: nothing of it to keep")
    cached = DVCFileSystem(str(repo), rev=rev)  # the predictions, from DVC's cache
    for config in configs:
        for suffix in RUN_FILES:
            path = f"metrics/multitask/{config}{suffix}"
            atomic_write_text(repo / path, git(repo, "show", f"{rev}:{path}"))
        for task in MULTITASK_TASKS:
            for split in PREDICTIONS:
                source = f"predictions/multitask/{config}/{task}-{split}-out.csv"
                target = repo / "metrics" / EXTRA_RUNS_DIR / source
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(target, cached.read_text(source, encoding="utf-8"))
    record = {
        "command": COMMAND,
        "experiment": name,
        "experiment_commit": rev,
        "how": how,
        "stages": {stage(c): lock[stage(c)] for c in configs},
    }
    atomic_write_text(repo / "metrics" / EXTRA_RUNS_FILE, json.dumps(record, indent=2) + "\n")
    return record
