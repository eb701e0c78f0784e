"""The MLM study (``minbert mlm-study``): MLM pretraining and the fine-tuning of
``mlm.finetune`` from its checkpoint, run as one DVC experiment beside the default
pipeline (which leaves ``mlm.pretrain`` empty to stay within its time budget), and its
results copied into ``metrics/mlm-study/`` for the report: the runs' metrics files and
records, their dev predictions, and where they came from."""

from __future__ import annotations

import json
from pathlib import Path

from minbert.commits import git
from minbert.report.pretraining import MLM_PREDICTIONS, MLM_PROVENANCE, MLM_STUDY_DIR, tuned_name
from minbert.results import is_record, metrics_from_text
from minbert.tools.sweep import lock_stages, temp_experiment

COMMAND = "minbert mlm-study"


def targets(starts: list[str], finetune: list[str]) -> list[str]:
    """The experiment's stages: each MLM start, then each configuration fine-tuned from it."""
    return [f"mlm@{s}" for s in starts] + [f"multitask-mlm@{s}-{c}" for s in starts for c in finetune]


def run_mlm_study(repo: Path, starts: list[str]) -> dict:
    """Run the experiment from the current commit, then copy its results under ``metrics/mlm-study``."""
    from minbert.pipeline.params import load

    stages = targets(starts, load(repo / "params.yaml")["mlm"]["finetune"])
    name, rev, how = temp_experiment(repo, "mlm-study", f"mlm.pretrain=[{','.join(starts)}]", stages)
    return keep(repo, rev, name, how)


def keep(repo: Path, rev: str, name: str, how: str) -> dict:
    """Copy the MLM runs of the experiment at ``rev`` (metrics files with their records, and
    the fine-tuned runs' dev predictions) under ``metrics/mlm-study``, with the metrics of
    the configurations they are compared with at that commit (the report shows the
    differences only while those are still the current ones)."""
    import shutil

    from dvc.api import DVCFileSystem

    from minbert.atomic import atomic_write_text
    from minbert.runs.training import MultitaskRunFile, read_runs
    from minbert.tasks import MULTITASK_TASKS

    # Metrics files and records by stage folder (the histories are the figures').
    listed = {
        folder: [
            p
            for p in git(repo, "ls-tree", "-r", "--name-only", rev, "--", f"metrics/{folder}").splitlines()
            if p.endswith(".json")
        ]
        for folder in ("mlm", "multitask-mlm")
    }
    # What each stage read, so that the report counts these runs only while it is unchanged:
    # checked before the study in place is replaced.
    lock = lock_stages(repo, rev) or {}
    names = [f"{f}@{Path(p).stem}" for f, paths in listed.items() for p in paths if not is_record(p)]
    if missing := [n for n in names if n not in lock]:
        raise ValueError(f"{rev[:7]}:dvc.lock has no stage {', '.join(missing)}: no record of what it read")
    out = repo / "metrics" / MLM_STUDY_DIR
    shutil.rmtree(out, ignore_errors=True)
    for folder, paths in listed.items():
        for path in paths:
            target = out / folder / Path(path).name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(git(repo, "show", f"{rev}:{path}"), encoding="utf-8")
    tuned = read_runs(MultitaskRunFile, out / "multitask-mlm")
    cached = DVCFileSystem(str(repo), rev=rev)  # the predictions, from DVC's cache
    for run in (tuned_name(m) for m in tuned):
        for task in MULTITASK_TASKS:
            source = f"predictions/multitask-mlm/{run}/{task}-dev-out.csv"
            target = out / MLM_PREDICTIONS / "multitask-mlm" / run / f"{task}-dev-out.csv"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(cached.read_text(source, encoding="utf-8"), encoding="utf-8")
    configs = sorted({m.config for m in tuned})
    provenance = {
        "command": COMMAND,
        "experiment": name,
        "experiment_commit": rev,
        "how": how,
        # The metrics file of each configuration fine-tuned from the original checkpoint.
        "compared_with": {
            c: metrics_from_text(git(repo, "show", f"{rev}:metrics/multitask/{c}.json"), f"{rev[:7]}:{c}")
            for c in configs
        },
        "stages": {n: lock[n] for n in names},
    }
    atomic_write_text(out / MLM_PROVENANCE, json.dumps(provenance, indent=2) + "\n")
    return provenance
