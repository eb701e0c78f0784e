"""Every configuration of params.yaml through its own DVC stage under
`torchrun --nproc_per_node 2` (gloo on the CPU), at a tiny size: the stages `dvc repro`
runs when `launcher` names torchrun, MLM-started fine-tuning included. That each rank
makes the one-process update is tests/test_distributed.py's."""

from __future__ import annotations

import pytest
import yaml
from test_pipeline import _run, _tiny_scale, make_project

from minbert.results import read_result

pytestmark = pytest.mark.slow

ROWS = 40
LAUNCHER = "torchrun --standalone --nproc_per_node 2"


def _under_torchrun(params: dict) -> None:
    _tiny_scale(params)
    params["launcher"] = LAUNCHER
    params["mlm"]["pretrain"] = ["continue"]
    params["repro_configs"] = list(params["configs"])  # every one, those `dvc repro` leaves out too


def test_every_configuration_trains_through_its_stage_under_torchrun(tmp_path, shared_data, tiny_checkpoint):
    root = make_project(tmp_path, shared_data, tiny_checkpoint, ROWS, _under_torchrun)
    _run(["dvc", "repro", "multitask", "multitask-mlm"], root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    names = [("multitask", c) for c in params["configs"]]
    names += [
        ("multitask-mlm", f"{s}-{c}") for s in params["mlm"]["pretrain"] for c in params["mlm"]["finetune"]
    ]
    assert len(names) == len(params["configs"]) + 1
    for stage, name in names:
        assert lock[f"{stage}@{name}"]["cmd"].startswith(LAUNCHER), name
        metrics = read_result(root / "metrics" / stage / f"{name}.json")
        assert metrics["processes"] == 2 and metrics["device"].startswith("2 x cpu"), name
        assert metrics["steps"] > 0 and 0 <= metrics["sst"] <= 1, name
