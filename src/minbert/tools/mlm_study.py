"""The MLM study (``minbert mlm-study``): MLM pretraining and the fine-tuning of
``mlm.finetune`` from its checkpoint, run as one DVC experiment beside the default
pipeline (which leaves ``mlm.pretrain`` empty to stay within its time budget), and its
results copied into ``metrics/mlm-study/`` for the report: the runs' metrics files and
records, their dev predictions, and where they came from."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from minbert.commits import git
from minbert.report.pretraining import MLM_PREDICTIONS, MLM_PROVENANCE, MLM_STUDY_DIR, tuned_name
from minbert.results import RECORD_SUFFIX, metrics_from_text
from minbert.tools.sweep import DVC, lock_stages

COMMAND = "minbert mlm-study"


def targets(starts: list[str], finetune: list[str]) -> list[str]:
    """The experiment's stages: each MLM start, then each configuration fine-tuned from it."""
    return [f"mlm@{s}" for s in starts] + [f"multitask-mlm@{s}-{c}" for s in starts for c in finetune]


def experiment_name(commit: str) -> str:
    return f"mlm-study-{commit[:7]}"


def run_mlm_study(repo: Path, starts: list[str]) -> dict:
    """Run the experiment from the current commit (in a temporary copy: the workspace and
    DVC's queue are left alone), then copy its results under ``metrics/mlm-study``."""
    from minbert.pipeline.params import load

    params = load(repo / "params.yaml")
    commit = git(repo, "rev-parse", "HEAD").strip()
    name = experiment_name(commit)
    stages = targets(starts, params["mlm"]["finetune"])
    override = f"mlm.pretrain=[{','.join(starts)}]"
    # A rerun from the same commit replaces the earlier experiment of that name.
    subprocess.run([*DVC, "exp", "remove", name], cwd=repo, capture_output=True)
    subprocess.run(
        [*DVC, "exp", "run", "--temp", "--name", name, "-S", override, *stages], cwd=repo, check=True
    )
    ref = f"refs/exps/{commit[:2]}/{commit[2:]}/{name}"
    how = f"`dvc exp run --temp -S '{override}' {' '.join(stages)}` from commit {commit[:7]}"
    return keep(repo, git(repo, "rev-parse", ref).strip(), name, how)


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

    out = repo / "metrics" / MLM_STUDY_DIR
    shutil.rmtree(out, ignore_errors=True)
    for folder in ("mlm", "multitask-mlm"):
        listed = git(repo, "ls-tree", "-r", "--name-only", rev, "--", f"metrics/{folder}").splitlines()
        for path in listed:
            if path.endswith(".json"):  # metrics files and records; the histories are the figures'
                target = out / folder / Path(path).name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(git(repo, "show", f"{rev}:{path}"), encoding="utf-8")
    tuned = read_runs(MultitaskRunFile, out / "multitask-mlm")
    cached = DVCFileSystem(str(repo), rev=rev)  # the predictions, from DVC's cache
    runs = [tuned_name(m) for m in tuned]
    for run in runs:
        for task in MULTITASK_TASKS:
            source = f"predictions/multitask-mlm/{run}/{task}-dev-out.csv"
            target = out / MLM_PREDICTIONS / "multitask-mlm" / run / f"{task}-dev-out.csv"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(cached.read_text(source, encoding="utf-8"), encoding="utf-8")
    configs = sorted({m.config for m in tuned})
    # What each stage read, so that the report counts these runs only while it is unchanged.
    lock = lock_stages(repo, rev) or {}
    starts = sorted(p.stem for p in (out / "mlm").glob("*.json") if not p.name.endswith(RECORD_SUFFIX))
    names = [f"mlm@{s}" for s in starts] + [f"multitask-mlm@{r}" for r in runs]
    if missing := [n for n in names if n not in lock]:
        raise ValueError(f"{rev[:7]}:dvc.lock has no stage {', '.join(missing)}: no record of what it read")
    stages = {n: lock[n] for n in names}
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
        "stages": stages,
    }
    atomic_write_text(out / MLM_PROVENANCE, json.dumps(provenance, indent=2) + "\n")
    return provenance
