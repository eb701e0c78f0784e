"""Interrupted training resumes and ends with the numbers of an uninterrupted run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from conftest import REPO, tiny_multitask_scale, tiny_sentiment_scale
from test_multitask import tiny_tables

from minbert.pipeline.schema import validate
from minbert.train import resume
from minbert.train.resume import ResumePoint, fingerprint

# Runs one stage's function in a child process, so that the test can kill it.
CHILD = """
import json, sys, yaml
from pathlib import Path
from minbert.pipeline import mlm, multitask, params, sentiment, sentiment_features
from minbert.pipeline.schema import validate

kind, name, params_file, tok, out, resume = sys.argv[1:]
p = validate(yaml.safe_load(Path(params_file).read_text()))
out = Path(out)
if kind == "multitask":
    manifest = Path(tok).parent / "prepared" / "manifest.json"
    split = json.loads(manifest.read_text())["quora_split"]
    multitask.run(params.resolve_multitask(p, name, split), Path(tok), manifest, out / "metrics",
                  out / "pred", resume_dir=Path(resume))
elif kind == "mlm":
    mlm.run(params.resolve_mlm(p, name), Path(tok), out / "models", out / "metrics", resume_dir=Path(resume))
else:
    task = p["sentiment"]["runs"][name]["task"]
    features = params.resolve_sentiment_features(p)
    features["tasks"] = {task: features["tasks"][task]}
    sentiment_features.run(features, Path(tok), out / "features")
    sentiment.run(params.resolve_sentiment(p, name), Path(tok), out / "features", out / "metrics",
                  out / "pred", resume_dir=Path(resume))
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_checkpoint):
    root = tiny_tables(tmp_path_factory.mktemp("resume"), tiny_checkpoint)
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p.update(checkpoint=str(tiny_checkpoint), device="cpu")
    tiny_multitask_scale(p, epochs=6, batch_size={"sst": 4, "quora": 4, "sts": 4})
    tiny_sentiment_scale(
        p, batch_size=4, epochs={"last-layer": 6, "full": 6}, train_examples={"sst": 0, "cfimdb": 0}
    )
    p["scales"]["cpu"]["mlm"] = {"max_length": 32, "epochs": 6, "batch_size": 4, "sequences": 0}
    p["mlm"]["sources"] = ["sst", "quora", "sts"]  # the tasks this fixture tokenised
    validate(p)
    (root / "params.yaml").write_text(yaml.safe_dump(p))
    return root


def _start(setup, kind, name, out, resume):
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            kind,
            name,
            str(setup / "params.yaml"),
            str(setup / "tok"),
            str(out),
            str(resume),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc) -> str:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return err


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, name",
    [("multitask", "best"), ("sentiment", "sst-full"), ("sentiment", "sst-last-layer"), ("mlm", "continue")],
)
def test_killed_run_resumes_to_the_same_metrics(setup, tmp_path, kind, name):
    whole = tmp_path / "whole"
    _finish(_start(setup, kind, name, whole, tmp_path / "resume-whole"))

    cut = tmp_path / "cut"
    state = tmp_path / "resume-cut" / f"{kind}-{name}.pt"
    proc = _start(setup, kind, name, cut, state.parent)
    deadline = time.monotonic() + 240
    while not state.exists():  # written (atomically) at the end of epoch 1
        assert proc.poll() is None, f"the run ended before saving any state: {proc.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (cut / "metrics" / f"{name}.json").exists()  # killed mid-run: no results
    saved = torch.load(state, weights_only=True)["state"]
    assert 1 <= saved["epoch"] < 6

    assert "resumed from" in _finish(_start(setup, kind, name, cut, state.parent))
    for suffix in (".json", "-run.json", "-history.csv"):
        assert (cut / "metrics" / f"{name}{suffix}").read_text() == (
            whole / "metrics" / f"{name}{suffix}"
        ).read_text()
    if kind == "mlm":  # the pretrained checkpoint, too
        weights = f"models/{name}/model.safetensors"
        assert (cut / weights).read_bytes() == (whole / weights).read_bytes()
    assert not state.exists()  # removed once the outputs are written


def test_a_state_from_another_run_is_not_resumed(tmp_path):
    point = ResumePoint(tmp_path, "x", fingerprint(lr=1e-3))
    point.save({"epoch": 2, "weights": torch.ones(3)})
    assert point.load()["epoch"] == 2
    assert ResumePoint(tmp_path, "x", fingerprint(lr=1e-4)).load() is None
    # A damaged file is not guessed past: the error names it and says what to do.
    (tmp_path / "x.pt").write_bytes(b"truncated")
    with pytest.raises(ValueError, match=r"x\.pt: not a readable resume state .*delete it to start"):
        point.load()
    point.clear()
    assert not (tmp_path / "x.pt").exists()
    assert ResumePoint(None, "x", "k").load() is None  # resuming switched off


def test_a_state_saved_in_another_format_is_not_resumed(tmp_path, monkeypatch):
    ResumePoint(tmp_path, "x", fingerprint(lr=1e-3)).save({"history": [{"epoch": 1}]})
    assert ResumePoint(tmp_path, "x", fingerprint(lr=1e-3)).load() is not None
    monkeypatch.setattr(resume, "STATE_FORMAT", resume.STATE_FORMAT + 1)
    assert ResumePoint(tmp_path, "x", fingerprint(lr=1e-3)).load() is None


def test_resume_state_refuses_code_executing_pickles(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))

    (tmp_path / "x.pt").write_bytes(pickle.dumps({"key": "k", "state": Evil()}))
    with pytest.raises(ValueError, match="not a readable resume state"):  # refused, never run
        ResumePoint(tmp_path, "x", "k").load()


def test_generator_states_carry_every_cuda_generator(monkeypatch):
    # No GPU here: the CUDA calls are stood in for, to check what is saved and restored.
    import numpy as np

    from minbert.train.resume import generator_states, restore_generators

    devices = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [d.clone() for d in devices])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: restored.extend(states))
    extra = torch.Generator().manual_seed(3)
    state = generator_states(np.random.default_rng(0), extra)
    assert [s.tolist() for s in state["cuda"]] == [[1, 2], [3]]
    expected = torch.rand(2, generator=extra)
    restore_generators(state, np.random.default_rng(1), extra)
    assert [s.tolist() for s in restored] == [[1, 2], [3]]
    assert torch.equal(torch.rand(2, generator=extra), expected)
    # A state from a machine with another number of devices is refused, not half-restored.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="2 CUDA generator state"):
        restore_generators(state, np.random.default_rng(1), extra)
