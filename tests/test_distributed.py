"""Data-parallel multitask training: two gloo processes on the CPU against one.

Two ranks with batch b must make the same updates as one process with batch 2b
(up to floating point), with round-robin, with PCGrad and with SMART; the ranks
must stay identical to each other (parameters and SMART's EMA teacher); and the
stage must write its outputs once, from rank 0. The data has 31 rows per task, 25 of
them trained on (6 are the validation split), so the last batch of every epoch holds
one row: one rank's shard of it is empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import distributed_worker
import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, tiny_multitask_scale
from test_multitask import _prepared

from minbert.data.predictions import read_predictions
from minbert.data.tokenize import tokenize_prepared
from minbert.distributed import World
from minbert.pipeline import features, resolve
from minbert.pipeline import params as params_module
from minbert.pipeline.schema import validate
from minbert.results import read_result
from minbert.tasks import MULTITASK_TASKS

# Every configuration params.yaml defines: round-robin, summed losses, PCGrad, SMART and
# their combinations, each head.
CONFIGS = list(yaml.safe_load((REPO / "params.yaml").read_text())["configs"])


def _torchrun(script: Path, *args, cwd: Path | None = None) -> None:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            *map(str, args),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("ddp")
    _prepared(root / "prepared", n=31)  # 25 training rows after the 6 of validation
    tokenize_prepared(
        root / "prepared", root / "tok", tiny_checkpoint / "vocab.txt", {"sst": 32, "quora": 32, "sts": 32}
    )
    return root


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tokenized, tiny_checkpoint):
    out = tmp_path_factory.mktemp("ranks")
    _torchrun(REPO / "tests" / "distributed_worker.py", tokenized / "tok", tiny_checkpoint, out, 1, *CONFIGS)
    return {
        (config, rank): torch.load(out / f"{config}-rank{rank}.pt", weights_only=True)
        for config in CONFIGS
        for rank in (0, 1)
    }


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_two_ranks_match_one_process_with_the_doubled_batch(two_ranks, tokenized, tiny_checkpoint, config):
    single = distributed_worker.run(tokenized / "tok", tiny_checkpoint, 2, config, World())
    rank0, rank1 = two_ranks[config, 0], two_ranks[config, 1]
    # The ranks hold the very same model, and the same EMA teacher after every step.
    for name, value in rank0["encoder"].items():
        assert torch.equal(value, rank1["encoder"][name]), name
    assert rank0["teacher_sums"] == rank1["teacher_sums"]
    assert rank0["history"] == rank1["history"]
    # Losses of every epoch (the mean over its steps) and the dev metrics after it.
    # (Written at 4 decimals: equal up to a rounding step.)
    for ours, theirs in zip(rank0["history"], single["history"], strict=True):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            if value is None:
                assert ours[key] is None, key
            else:
                assert ours[key] == pytest.approx(value, rel=1e-4, abs=2e-4), (key, ours["epoch"])
    # The final parameters.
    for name, value in single["encoder"].items():
        torch.testing.assert_close(rank0["encoder"][name], value, rtol=1e-4, atol=2e-5, msg=name)
    for task in MULTITASK_TASKS:
        # STS predictions are written at 3 decimals: equal up to a rounding step.
        torch.testing.assert_close(
            rank0["dev_predictions"][task],
            single["dev_predictions"][task],
            rtol=1e-4,
            atol=1.1e-3,
            msg=task,
            check_dtype=False,
        )
    settings = distributed_worker.settings_for(config, tiny_checkpoint, 1)
    if settings.gradient != "pcgrad":
        assert not rank0["conflicts"]
    else:
        # PCGrad sees the same (rank-averaged) task gradients as the single process.
        assert len(rank0["conflicts"]) == len(single["conflicts"]) > 0
        for ours, theirs in zip(rank0["conflicts"], single["conflicts"]):
            assert ours["conflicts"] == theirs["conflicts"]
            # Written at 4 decimals: a rounding step apart at most.
            for key in ("cos_sst_quora", "cos_sst_sts", "cos_quora_sts"):
                assert ours[key] == pytest.approx(
                    theirs[key], abs=2e-4
                )  # 4 decimals: a rounding step apart at most
    if settings.smart is not None:
        assert len(rank0["teacher_sums"]) == len(single["teacher_sums"]) > 0
        np.testing.assert_allclose(rank0["teacher_sums"], single["teacher_sums"], rtol=1e-6)
    else:
        assert not rank0["teacher_sums"]


@pytest.mark.slow
def test_stage_under_torchrun_writes_once_from_rank_zero(tmp_path, tokenized, tiny_checkpoint):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(checkpoint=str(tiny_checkpoint), device="cpu", launcher="torchrun --nproc_per_node 2")
    tiny_multitask_scale(params, epochs=1, batch_size={"sst": 4, "quora": 3, "sts": 2})
    validate(params)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    manifest = tokenized / "prepared" / "manifest.json"
    resolve.run(tmp_path / "params.yaml", manifest, tmp_path / "data" / "settings")  # what `resolve` writes
    (tmp_path / "data" / "tokenized").symlink_to(tokenized / "tok")
    (tmp_path / "data" / "prepared").symlink_to(tokenized / "prepared")
    settings = json.loads((tmp_path / "data" / "settings" / "features.json").read_text())
    features.run(settings, tokenized / "tok", tmp_path / "data" / "features")  # what `features` writes
    # The command dvc.yaml gives the stage, run by torchrun.
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["multitask"]["do"]["cmd"]
    args = stage.replace("${item}", "best-no-smart").split()[2:]  # after the launcher and the script
    _torchrun(REPO / "stages" / "multitask.py", *args, cwd=tmp_path)
    metrics = read_result(tmp_path / "metrics" / "multitask" / "best-no-smart.json")
    assert metrics["processes"] == 2 and metrics["device"].startswith("2 x cpu")
    assert metrics["batch_size"] == {"sst": 4, "quora": 3, "sts": 2}
    for task in MULTITASK_TASKS:
        path = tmp_path / "predictions" / "multitask" / "best-no-smart" / f"{task}-dev-out.csv"
        lines = path.read_text().splitlines()[1:]
        assert len(lines) == 31 and set(read_predictions(path)) == {f"dev{i}" for i in range(31)}
    assert not list((tmp_path / ".resume").glob("*.pt"))  # cleared once the outputs exist


def test_sentiment_and_mlm_stages_refuse_several_processes(monkeypatch):
    from minbert.distributed import require_single_process

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match="stage sentiment runs in one process"):
        require_single_process("sentiment")
    monkeypatch.setenv("WORLD_SIZE", "1")
    require_single_process("sentiment")


def test_launcher_is_checked(tiny_checkpoint):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["launcher"] = "mpirun -n 4"
    with pytest.raises(params_module.ParamsError, match="launcher = 'mpirun -n 4' must be 'python' or"):
        validate(params)
