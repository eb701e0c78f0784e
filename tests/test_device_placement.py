"""Every stage kind that runs a model computes on its own device: each runs its dvc.yaml
command in-process with the device ``cpu:1``, which tests/device_guard.py makes a
device apart from the host (an operator mixing the two fails, as on CUDA)."""

from __future__ import annotations

import json
import runpy
import shlex
import sys

import numpy as np
import pytest
import torch
from device_guard import PRETEND, DeviceMismatch, PretendDevice
from test_pipeline import _run, _tiny_scale, make_project

from minbert.data.batches import TokenizedTable
from minbert.data.multitask import TaskData
from minbert.model.bert import BertModel
from minbert.train.head_warmup import frozen_vectors

# One stage of each kind, in an order that runs each after what it reads: sentiment's two
# modes (a frozen encoder, full fine-tuning), multitask with siamese heads and
# round-robin, and with a cross-encoder, PCGrad and SMART, and started from MLM.
STAGES = [
    "features",
    "zero-shot",
    "sentiment-features",
    "sentiment@sst-last-layer",
    "sentiment@cfimdb-full",
    "multitask@baseline",
    "multitask@best",
    "mlm@continue",
    "multitask-mlm@continue-baseline",
]


def test_the_guard_fails_an_operator_that_mixes_host_and_device():
    with PretendDevice() as guard:
        on_device = torch.ones(3, 4).to(PRETEND)
        assert on_device.device == PRETEND and torch.zeros(2, device=PRETEND).device == PRETEND
        assert (on_device * 2).device == PRETEND and (on_device * torch.tensor(2.0)).device == PRETEND
        on_device[torch.tensor([0, 2])] = 0.0  # a host index, as CUDA allows
        host = torch.ones(3, 4)
        with pytest.raises(DeviceMismatch, match="mixes tensors on the host and on the device"):
            on_device + host
        with pytest.raises(DeviceMismatch, match="numpy"):
            on_device.numpy()
        assert on_device.cpu().numpy().shape == (3, 4)
        linear = torch.nn.Linear(4, 2)
        with pytest.raises(DeviceMismatch):
            linear(on_device)  # parameters still on the host
        assert linear.to(PRETEND)(on_device).device == PRETEND
    assert guard.checked > 0


def test_the_guard_catches_an_encoder_left_on_the_host(tmp_path, tiny_checkpoint):
    # The features stage once loaded the encoder and sent only the batches to the device.
    from test_multitask import _prepared

    from minbert.data.tokenize import tokenize_prepared

    _prepared(tmp_path / "prepared", n=12)
    tokenize_prepared(
        tmp_path / "prepared",
        tmp_path / "tok",
        tiny_checkpoint / "vocab.txt",
        dict.fromkeys(("sst", "quora", "sts"), 32),
    )
    data = TaskData("sst", TokenizedTable.read(tmp_path / "tok" / "sst-train.parquet"), False)
    with PretendDevice(), pytest.raises(DeviceMismatch, match="embedding mixes"):
        frozen_vectors(BertModel.from_pretrained(tiny_checkpoint), "mean", data, 4, PRETEND)
    with PretendDevice():
        encoder = BertModel.from_pretrained(tiny_checkpoint).to(PRETEND)
        vectors = frozen_vectors(encoder, "mean", data, 4, PRETEND)
        assert vectors.device == PRETEND and np.isfinite(vectors.cpu().numpy()).all()


@pytest.mark.slow
def test_every_stage_kind_computes_on_its_device(tmp_path, shared_data, tiny_checkpoint, monkeypatch, capsys):
    from dvc.repo import Repo

    root = make_project(tmp_path, shared_data, tiny_checkpoint, 24, _tiny_scale)
    _run(["dvc", "repro", "tokenize"], root)
    for path in (root / "data" / "settings").rglob("*.json"):
        settings = json.loads(path.read_text())
        if "device" in settings:
            path.write_text(json.dumps({**settings, "device": str(PRETEND)}))
    with Repo(str(root)) as repo:
        commands = {stage.name: stage.cmd for stage in repo.index.stages if stage.name in STAGES}
    assert sorted(commands) == sorted(STAGES)
    monkeypatch.chdir(root)
    for name in STAGES:
        script, *args = shlex.split(commands[name])[1:]  # after the launcher
        monkeypatch.setattr(sys, "argv", [script, *args])
        with PretendDevice() as guard:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as stopped:  # the stage's one-line error
                pytest.fail(f"{name}: {stopped} {capsys.readouterr().err[-2000:]}")
        assert guard.checked > 100, name  # it computed on the device
