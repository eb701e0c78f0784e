"""Tiny multitask training runs for tests/test_distributed.py.

Started by that test under ``torchrun --nproc_per_node 2`` (each rank writes what
it saw to ``OUT/<config>-rank<r>.pt``), and called in-process for the
single-process reference. Dropout is off, so that one process with batch 2b and
two with batch b can make the same updates.

    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        tests/distributed_worker.py TOKENIZED_DIR CHECKPOINT OUT BATCH_SCALE CONFIG...
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch
import yaml
from conftest import tiny_multitask_scale

from minbert import distributed
from minbert.data.batches import TokenizedTable
from minbert.model.bert import BertModel
from minbert.pipeline import params as params_module
from minbert.pipeline.schema import validate
from minbert.tasks import MULTITASK_TASKS
from minbert.train.multitask import train_multitask
from minbert.train.smart import EmaTeacher

REPO = Path(__file__).resolve().parents[1]
BATCH = {"sst": 4, "quora": 3, "sts": 2}  # per process, times BATCH_SCALE


def settings_for(config: str, checkpoint: Path, batch_scale: int):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(checkpoint=str(checkpoint), device="cpu")
    tiny_multitask_scale(params, epochs=2, batch_size={t: b * batch_scale for t, b in BATCH.items()})
    params["scales"]["cpu"]["multitask"]["eval_batch_size"] = 5
    settings = params_module.multitask_settings(validate(params), config)
    if settings.smart is not None:  # a ball and a step large enough to matter in float32
        ball = dataclasses.replace(settings.smart, projection="ball", epsilon=1e-2, step_size=1.0)
        settings = dataclasses.replace(settings, smart=ball)
    return dataclasses.replace(settings, dropout=0.0)


def run(
    tokenized: Path,
    checkpoint: Path,
    batch_scale: int,
    config: str,
    world: distributed.World = distributed.World(),
) -> dict:
    """Train ``config`` and return what the test compares."""
    tables = {
        (t, s): TokenizedTable.read(tokenized / f"{t}-{s}.parquet")
        for t in MULTITASK_TASKS
        for s in ("train", "dev")
    }
    encoder = BertModel.from_pretrained(checkpoint)
    for module in encoder.modules():  # dropout off: the same maths at any batch split
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0
    teacher_sums = []
    original = EmaTeacher.update

    def update(self, model):  # record the teacher after every step
        original(self, model)
        teacher_sums.append(float(sum(p.double().sum() for p in self.module.parameters())))

    EmaTeacher.update = update
    try:
        result = train_multitask(
            settings_for(config, checkpoint, batch_scale), encoder, tables, torch.device("cpu"), world=world
        )
    finally:
        EmaTeacher.update = original
    return {
        "history": [epoch.row() for epoch in result.history],
        "conflicts": result.conflicts,
        "encoder": encoder.state_dict(),
        "teacher_sums": teacher_sums,
        "dev_predictions": {t: torch.from_numpy(v) for t, v in result.dev_predictions.items()},
    }


def main(argv: list[str]) -> None:
    tokenized, checkpoint, out, batch_scale, *configs = argv
    world, _ = distributed.start("cpu")
    try:
        for config in configs:
            seen = run(Path(tokenized), Path(checkpoint), int(batch_scale), config, world)
            torch.save(seen, Path(out) / f"{config}-rank{world.rank}.pt")
    finally:
        distributed.stop(world)


if __name__ == "__main__":
    main(sys.argv[1:])
