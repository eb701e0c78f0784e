"""The task heads fitted on the frozen checkpoint before fine-tuning (why: docs/method.md).

Each head trains on the pooled vectors of the rows the run fine-tunes on, never others
(the ``features`` stage's, or computed here in eval mode): up to ``epochs``
passes of AdamW (weight decay on weight matrices only), heads in training mode, keeping
the pass with the lowest validation loss (taken in eval mode). The cosine head has
nothing to fit. Every draw is seeded and the global random state restored, so every
rank fits the same heads and training runs as it would have without the warm-up."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from minbert.data.batches import length_bucketed_batches, random_batches
from minbert.data.multitask import TaskData
from minbert.device import compute_context, pad_multiple, to_device
from minbert.metrics import fixed
from minbert.model.bert import BertModel
from minbert.model.heads import pool
from minbert.model.multitask import MultitaskBert, task_loss
from minbert.settings import MultitaskSettings, RunStart
from minbert.tasks import TASKS

# The splits the features stage encodes: the warm-up's rows, and dev for the start's scores.
FEATURE_SPLITS = ("train", "dev")


def layout(task: str, siamese: bool) -> str:
    """How a task's rows are encoded for its head: one sentence, each sentence of a pair
    on its own (siamese heads), or the pair packed into one sequence (cross-encoder)."""
    return "siamese" if siamese else ("cross" if TASKS[task].is_pair else "sentence")


def feature_file(task: str, split: str, siamese: bool) -> str:
    """The features stage's name for a task's split in a layout (``<name>.npy``)."""
    return f"{task}-{split}-{layout(task, siamese)}"


@torch.no_grad()  # not inference_mode: the heads' backward pass saves these
def frozen_vectors(
    encoder: BertModel, pooling: str, data: TaskData, batch_size: int, device: torch.device
) -> torch.Tensor:
    """The pooled vectors of every row of ``data`` from ``encoder`` in eval mode:
    ``(rows, hidden)``, or ``(rows, 2, hidden)`` for siamese rows (the pair's two sentences)."""
    was_training = encoder.training
    encoder.eval()
    parts, order = [], []
    for rows in length_bucketed_batches(data.lengths, batch_size, shuffle=False):
        batch = data.batch(rows, pad_multiple(device)).to(device)
        with compute_context(device):
            output = encoder.encode(
                encoder.embed(batch.ids, batch.token_types), batch.mask if batch.padded else None
            )
            pooled = pool(output, batch.mask, pooling).float()
        parts.append(torch.stack(pooled.chunk(2), dim=1) if data.siamese else pooled)
        order.append(rows)
    encoder.train(was_training)
    vectors = torch.empty(len(data), *parts[0].shape[1:], device=parts[0].device)
    vectors[torch.from_numpy(np.concatenate(order)).to(vectors.device)] = torch.cat(parts)
    return vectors


def pooled_vectors(
    model: MultitaskBert, task: str, data: TaskData, batch_size: int, device: torch.device
) -> torch.Tensor:
    """What ``model``'s head for ``task`` reads for every row of ``data``, from its encoder
    in eval mode (:func:`frozen_vectors`)."""
    return frozen_vectors(model.encoder, model.pooling, data, batch_size, device)


class ProbeFeatures:
    """The ``features`` stage's output: per task, split and :func:`layout`, the frozen
    checkpoint's pooled vectors of the rows it took (``<task>-<split>-<layout>.npy``), with
    ``index.json`` naming the checkpoint, the pooling and each file's rows. Opened for a
    reader's checkpoint (its weights' sha256) and pooling: vectors of others are refused."""

    INDEX = "index.json"

    def __init__(self, directory: Path, checkpoint_sha256: str, pooling: str):
        self.directory = Path(directory)
        index = self.directory / self.INDEX
        if not index.is_file():
            raise FileNotFoundError(f"{index}: no probe features index (run `dvc repro features`)")
        self.index = json.loads(index.read_text(encoding="utf-8"))
        made = (self.index["checkpoint"]["sha256"], self.index["pooling"])
        if made != (checkpoint_sha256, pooling):
            raise ValueError(
                f"{index}: vectors of another checkpoint or pooling (weights {made[0][:12]}, {made[1]!r}) "
                f"than the reader's ({checkpoint_sha256[:12]}, {pooling!r}): run `dvc repro features`"
            )
        self._ids: dict[str, dict[str, int]] = {}

    def _rows(self, name: str) -> dict[str, int] | None:
        """A file's row of each id (read from the index once); None: no such file."""
        if name not in self.index["files"]:
            return None
        if name not in self._ids:
            self._ids[name] = {i: k for k, i in enumerate(self.index["files"][name]["ids"])}
        return self._ids[name]

    def covers(self, data: TaskData, split: str) -> bool:
        """Whether every row of ``data`` (rows of ``split``) has a vector here."""
        where = self._rows(feature_file(data.task, split, data.siamese))
        return where is not None and all(i in where for i in data.table.ids)

    def covered(self, tasks: dict[str, TaskData], split: str) -> dict[str, torch.Tensor]:
        """On the host, the vectors of every task of ``tasks`` whose rows of ``split`` it all holds."""
        cpu = torch.device("cpu")
        held = {t: d for t, d in tasks.items() if self.covers(d, split)}
        return {t: self.vectors(d, d.table.ids, cpu, split) for t, d in held.items()}

    def vectors(
        self, data: TaskData, ids: list[str], device: torch.device, split: str = "train"
    ) -> torch.Tensor:
        """The vectors of the rows named ``ids`` of ``data``'s task and ``split``, in its layout."""
        name = feature_file(data.task, split, data.siamese)
        where = self._rows(name)
        if where is None:
            raise KeyError(f"{self.directory}: no probe features for {name}")
        entry = self.index["files"][name]
        array = np.load(self.directory / f"{name}.npy", mmap_mode="r")
        if array.shape[0] != entry["rows"]:
            raise ValueError(
                f"{self.directory / name}.npy: {array.shape[0]} rows, the index says {entry['rows']}"
            )
        missing = [i for i in ids if i not in where]
        if missing:
            raise KeyError(f"{self.directory / name}.npy: no vector for ids {missing[:5]}")
        return to_device(torch.from_numpy(np.array(array[[where[i] for i in ids]])), device)


def _head_loss(model: MultitaskBert, task: str, vectors: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if model.is_siamese(task):  # back to the stacked layout of MultitaskBert.pooled
        vectors = torch.cat([vectors[:, 0], vectors[:, 1]])
    return task_loss(task, model.head_output(task, vectors), labels)


def _validation_loss(model: MultitaskBert, task: str, vectors: torch.Tensor, labels: torch.Tensor) -> float:
    head = model.heads[task]
    head.eval()
    with torch.no_grad():
        loss = _head_loss(model, task, vectors, labels).item()
    head.train()
    return loss


def warm_up_heads(
    model: MultitaskBert,
    train: dict[str, TaskData],
    validation: dict[str, TaskData],
    settings: MultitaskSettings | RunStart,
    device: torch.device,
    features: ProbeFeatures | None = None,
) -> dict[str, dict]:
    """Fit the heads of ``settings.head_warmup.tasks`` (see the module); per fitted task:
    its rows, the pass kept (0: none beat the fresh head), the validation loss before and
    after."""
    warmup, seed = settings.head_warmup, settings.seed
    if warmup.epochs == 0:
        return {}
    rng = np.random.default_rng(seed)
    report = {}
    devices = [device] if device.type == "cuda" else []

    def vectors(data: TaskData) -> torch.Tensor:
        # Rows other than the stage's (another seed, a benchmark's sizes) are encoded here.
        if features is not None and features.covers(data, "train"):
            return features.vectors(data, data.table.ids, device)
        return pooled_vectors(model, data.task, data, settings.eval_batch_size, device)

    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for task, data in train.items():
            if task not in warmup.tasks:
                continue
            head = model.heads[task]
            params = [p for p in head.parameters() if p.requires_grad]
            if not params:
                continue
            x, y = vectors(data), to_device(data.labels(np.arange(len(data))), device)
            val_x = vectors(validation[task])
            val_y = to_device(validation[task].labels(np.arange(len(validation[task]))), device)
            optimizer = torch.optim.AdamW(
                [
                    {"params": [p for p in params if p.ndim >= 2], "weight_decay": settings.weight_decay},
                    {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
                ],
                lr=warmup.lr,
            )

            before = best_loss = _validation_loss(model, task, val_x, val_y)
            best_epoch, best_state = 0, {k: v.clone() for k, v in head.state_dict().items()}
            head.train()
            for epoch in range(1, warmup.epochs + 1):
                for rows in random_batches(len(data), warmup.batch_size, rng):
                    index = torch.from_numpy(rows).to(device)
                    optimizer.zero_grad(set_to_none=True)
                    _head_loss(model, task, x[index], y[index]).backward()
                    optimizer.step()
                loss = _validation_loss(model, task, val_x, val_y)
                if loss < best_loss:
                    best_epoch, best_loss = epoch, loss
                    best_state = {k: v.clone() for k, v in head.state_dict().items()}
            head.load_state_dict(best_state)
            report[task] = {
                "rows": len(data),
                "epochs_kept": best_epoch,
                "validation_loss_before": fixed(before),
                "validation_loss_after": fixed(best_loss),
            }
    model.zero_grad(set_to_none=True)
    return report
