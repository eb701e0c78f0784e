"""Running the pipeline without DVC: bundle -> run with no dvc on PATH -> pack -> unpack
-> staleness check, on a tiny copy of the project and a slice of the course data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO
from test_pipeline import _slice, _tiny_scale

from minbert.model.bert import BertModel
from minbert.offline.bundle import read_bundle
from minbert.offline.runner import MAX_BYTES, MAX_FILES
from minbert.offline.stages import StageError, read_stages, select
from minbert.results import read_result

STAGES = ["prepare", "resolve", "tokenize", "multitask@baseline"]


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _minbert(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m minbert`` from the project copy's own sources, as on a node where
    nothing is installed."""
    env = dict(env or os.environ, PYTHONPATH=str(root / "src"))
    return subprocess.run(
        [sys.executable, "-m", "minbert", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory, shared_data, tiny_checkpoint) -> Path:
    root = tmp_path_factory.mktemp("offline") / "project"
    root.mkdir()
    for name in ("dvc.yaml", "params.yaml", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    for name in ("stages", "src", "reference"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _slice(shared_data, root.parent / "slice", 48)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params.update(checkpoint=str(tiny_checkpoint), device="cpu")
    params["data"].update(source=str(root.parent / "slice"), verify_checksums=False, skip_ids={})
    _tiny_scale(params)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "project")
    return root


@pytest.fixture(scope="module")
def round_trip(project, tmp_path_factory) -> dict:
    """The bundle made, the stages run with no dvc on PATH, the results unpacked."""
    work = tmp_path_factory.mktemp("trip")
    made = _minbert(project, "bundle", str(work / "bundle"))
    assert made.returncode == 0, made.stderr
    params_before = (project / "params.yaml").read_bytes()
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not shutil.which("dvc", path=p))
    assert shutil.which("dvc", path=path) is None
    args = ["offline-run", str(work / "bundle"), "--out", str(work / "out"), "--set", "seed=7"]
    for stage in STAGES:
        args += ["--stage", stage]
    ran = _minbert(project, *args, env=dict(os.environ, PATH=path))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    unpacked = _minbert(project, "gpu-unpack", str(work / "out" / "gpu-results.json"))
    assert unpacked.returncode == 0, unpacked.stderr
    return {"work": work, "params_before": params_before}


def test_the_bundle_carries_code_data_and_an_fp16_checkpoint(project, round_trip, tiny_checkpoint):
    bundle = round_trip["work"] / "bundle"
    described = read_bundle(bundle)
    assert described["commit"] == _git(project, "rev-parse", "HEAD").strip()
    assert {"code.tar", "data/ids-sst-train.csv", "checkpoint/model.safetensors"} <= set(described["files"])
    assert described["checkpoint"]["copy"] == "fp16"
    original, copy = (
        BertModel.from_pretrained(tiny_checkpoint),
        BertModel.from_pretrained(bundle / "checkpoint"),
    )
    for (name, a), b in zip(original.state_dict().items(), copy.state_dict().values()):
        assert b.dtype == torch.float32 and torch.allclose(a, b, atol=1e-3, rtol=1e-3), name
    # A damaged file is named.
    (bundle / "data" / "sts-dev.csv").write_text("damaged")
    with pytest.raises(ValueError, match="sts-dev.csv: sha256 differs"):
        read_bundle(bundle)


def test_the_run_packs_what_the_stages_wrote_and_leaves_params_alone(project, round_trip):
    out = round_trip["work"] / "out"
    files = sorted(out.iterdir())
    assert len(files) <= MAX_FILES and all(f.stat().st_size <= MAX_BYTES for f in files)
    assert (project / "params.yaml").read_bytes() == round_trip["params_before"]
    index = json.loads((out / "gpu-results.json").read_text())
    assert [s["stage"] for s in index["stages"]] == STAGES
    assert index["torch"] == torch.__version__ and index["params"]["seed"] == 7
    assert "metrics/multitask/baseline.json" in index["files"]
    assert not any(f.startswith(("models/", "data/tokenized")) for f in index["files"])


def test_unpacked_results_say_how_they_were_made(project, round_trip):
    gpu = project / "metrics" / "gpu"
    metrics = read_result(gpu / "metrics" / "multitask" / "baseline.json")
    assert metrics["seed"] == 7
    # The record says how the run was made; the metrics file stays numbers only.
    assert "offline_run" not in json.loads((gpu / "metrics" / "multitask" / "baseline.json").read_text())
    assert metrics["offline_run"]["checkpoint_copy"] == "fp16"
    assert metrics["offline_run"]["commit"] == _git(project, "rev-parse", "HEAD").strip()
    provenance = json.loads((gpu / "provenance.json").read_text())
    sources = next(s["sources"] for s in provenance["stages"] if s["stage"] == "multitask@baseline")
    assert "src/minbert/train/pcgrad.py" in sources and "stages/multitask.py" in sources


def test_gpu_status_tells_stale_stages_from_current_ones(project, round_trip):
    done = _minbert(project, "gpu-status")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": current") == len(STAGES)
    pcgrad = project / "src" / "minbert" / "train" / "pcgrad.py"
    text = pcgrad.read_text()
    try:
        pcgrad.write_text(text + "\n# changed\n")
        done = _minbert(project, "gpu-status")
        assert done.returncode == 1
        assert "multitask@baseline: stale: src/minbert/train/pcgrad.py changed" in done.stdout
        assert "prepare: current" in done.stdout and "tokenize: current" in done.stdout
    finally:
        pcgrad.write_text(text)
    params = project / "params.yaml"
    saved = params.read_text()
    try:
        # (the run's own --set seed=7 still holds: a change of seed here changes nothing)
        params.write_text(saved.replace("seed: 11711", "seed: 12"))
        assert _minbert(project, "gpu-status").returncode == 0
        params.write_text(saved.replace("quora_train_pairs: 2000", "quora_train_pairs: 1999"))
        done = _minbert(project, "gpu-status")
        assert done.returncode == 1 and done.stdout.count("params.yaml changed") == len(STAGES)
    finally:
        params.write_text(saved)


def test_stage_names_are_dvcs():
    """The offline reader expands dvc.yaml to the stages dvc.lock records, by name."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    stages = read_stages(REPO / "dvc.yaml", params)
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    # (dvc.lock may also keep entries of configurations removed since)
    assert {s.name for s in stages} <= set(lock["stages"])
    runs = yaml.safe_load((REPO / "params.yaml").read_text())["sentiment"]["runs"]
    assert [s.name for s in select(stages, ["sentiment"])] == [f"sentiment@{r}" for r in runs]
    with pytest.raises(StageError, match="no stage multitsk"):
        select(stages, ["multitsk"])
