"""What a multitask run starts from (its epoch 0): the model around the checkpoint's
encoder, the run's data (validation split, training rows, dev, test, the history's
slices) and the heads fitted on the frozen encoder. Apart from the training code so the
stages that only start a run (the zero-shot row's SST probe) do not depend on it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minbert.data.batches import TokenizedTable, subsample
from minbert.data.multitask import TaskData
from minbert.data.validation_split import run_rows
from minbert.distributed import World
from minbert.model.bert import BertModel
from minbert.model.multitask import MultitaskBert
from minbert.settings import MultitaskSettings, RunStart
from minbert.tasks import MULTITASK_TASKS
from minbert.train.head_warmup import ProbeFeatures, warm_up_heads


def build_model(
    settings: MultitaskSettings | RunStart,
    encoder: BertModel,
    device: torch.device,
    world: World = World(),
    compile_options: dict | None = None,
) -> MultitaskBert:
    """The multitask model of ``settings`` around ``encoder``, its heads drawn from the
    seed alike on every rank; afterwards each rank draws its own dropout masks. On a
    GPU the attention projections are fused (``BertModel.fuse_qkv``)."""
    torch.manual_seed(settings.seed)
    model = MultitaskBert(
        encoder,
        settings.paraphrase_head,
        settings.sts_head,
        settings.dropout,
        settings.pooling,
        settings.sts_output,
    ).to(device)
    torch.manual_seed(settings.seed + world.rank)
    if device.type == "cuda":  # one attention projection kernel instead of three
        model.encoder.fuse_qkv()
    if settings.compile:
        model.encoder.compile_layers(**(compile_options or {}))
    return model


@dataclass
class RunData:
    """The tables one run reads, as batches for its model's heads."""

    train: dict[str, TaskData]
    validation: dict[str, TaskData]  # set aside from the training split: chooses the epoch
    dev: dict[str, TaskData]
    test: dict[str, TaskData]
    slices: dict[str, dict[str, TaskData]]  # "dev" / "train": the history's fixed slices


def run_data(
    settings: MultitaskSettings | RunStart,
    model: MultitaskBert,
    tables: dict[tuple[str, str], TokenizedTable],
) -> RunData:
    """The validation splits, the training subsets drawn from the rest of the training
    splits, the full dev sets, the test sets (when predicted) and the history's fixed
    slices of the dev sets and of the training examples in use."""

    def data(task: str, table: TokenizedTable, limit: int = 0, seed: int = settings.seed) -> TaskData:
        return TaskData(task, subsample(table, limit, seed), model.is_siamese(task))

    rows = {
        t: run_rows(
            tables[t, "train"], settings.validation_examples[t], settings.train_examples[t], settings.seed
        )
        for t in MULTITASK_TASKS
    }
    train = {t: data(t, rows[t][0]) for t in MULTITASK_TASKS}
    validation = {t: data(t, rows[t][1]) for t in MULTITASK_TASKS}
    dev = {t: data(t, tables[t, "dev"]) for t in MULTITASK_TASKS if (t, "dev") in tables}  # none: a search
    test = {
        t: data(t, tables[t, "test"])
        for t in MULTITASK_TASKS
        if settings.test_predictions and (t, "test") in tables
    }
    sizes = settings.history_examples
    slices = {
        "dev": {t: data(t, d.table, sizes["dev"]) for t, d in dev.items()},
        "train": {t: data(t, train[t].table, sizes["train"], settings.seed + 1) for t in MULTITASK_TASKS},
    }
    return RunData(train, validation, dev, test, slices)


def start(
    settings: MultitaskSettings | RunStart,
    encoder: BertModel,
    tables: dict[tuple[str, str], TokenizedTable],
    device: torch.device,
    world: World = World(),
    compile_options: dict | None = None,
    features: ProbeFeatures | None = None,
    fit_heads: bool = True,
) -> tuple[MultitaskBert, RunData, dict[str, dict]]:
    """What a run starts from (its epoch 0): the model around ``encoder``, the run's data,
    and (``fit_heads``) its heads fitted on the frozen encoder's vectors of the rows it
    trains on, with the warm-up's report."""
    model = build_model(settings, encoder, device, world, compile_options)
    data = run_data(settings, model, tables)
    if not fit_heads:
        return model, data, {}
    return model, data, warm_up_heads(model, data.train, data.validation, settings, device, features)
