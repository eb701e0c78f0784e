"""The GPU runner's workflow (.github/workflows/gpu-study.yml), its commands run at a tiny
scale on the CPU: in a clone of a tiny project (as `actions/checkout` leaves it, main on
`origin`), every `run` step but the set-up, with bash as GitHub runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from test_offline import tiny_gpu_scale
from test_pipeline import ROWS, _run, _tiny_scale, make_project, tool_env

WORKFLOW = REPO / ".github" / "workflows" / "gpu-study.yml"
SETUP = "bash setup.sh"  # installs; the tests run in the installed environment


def steps() -> list[dict]:
    (job,) = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"].values()
    return job["steps"]


def _tiny(params: dict) -> None:
    """The tiny scale, with one stage of each kind: the workflow's commands are under test
    here, every configuration's stage in test_pipeline and test_offline."""
    _tiny_scale(params)
    params["scales"]["gpu"] = tiny_gpu_scale(params["scales"]["cpu"])
    configs = params["configs"]
    best = {k: v for k, v in configs["best"].items() if k != "from"}  # without its parent's stage
    best = {**configs[configs["best"]["from"]], **best}
    params["configs"] = {"baseline": configs["baseline"], "best": best}
    params["seed_study"]["configs"] = params["repro_configs"] = ["baseline", "best"]
    params["sentiment"]["runs"] = {"sst-full": params["sentiment"]["runs"]["sst-full"]}


@pytest.mark.slow
def test_the_workflow_runs_the_study_and_keeps_its_outputs(tmp_path, shared_data, tiny_checkpoint):
    (tmp_path / "origin").mkdir()
    origin = make_project(tmp_path / "origin", shared_data, tiny_checkpoint, ROWS, _tiny)
    # make_project already placed the one bench result the report reads
    shutil.copytree(
        REPO / "bench", origin / "bench", ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
    )
    _run(["git", "add", "-A"], origin)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "project"], origin)
    _run(["git", "branch", "-M", "main"], origin)
    _run(["git", "clone", "-q", str(origin), str(tmp_path / "runner")], tmp_path)
    runner = tmp_path / "runner"
    (runner / ".venv").symlink_to(Path(sys.prefix))
    summary = tmp_path / "summary.md"
    env = {**tool_env(), "GITHUB_STEP_SUMMARY": str(summary)}
    env.update(GIT_AUTHOR_NAME="runner", GIT_AUTHOR_EMAIL="r@r", GIT_COMMITTER_NAME="runner")
    env.update(GIT_COMMITTER_EMAIL="r@r")
    commands = [s["run"] for s in steps() if "run" in s]
    assert commands[0] == SETUP
    for command in commands[1:]:
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", command],
            cwd=runner,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    assert "| Path" in summary.read_text() and "metrics/multitask/best.json" in summary.read_text()
    (upload,) = [s for s in steps() if s.get("uses", "").startswith("actions/upload-artifact")]
    for path in upload["with"]["path"].split():
        assert (runner / path).exists(), path
    assert (runner / "report" / "README.md").is_file()
