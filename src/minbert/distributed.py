"""Data-parallel training with PyTorch's own distributed engine (``torchrun``).

A fine-tuning stage started by ``torchrun --nproc_per_node N`` (one machine) or by
``torchrun --nnodes M ...`` on every machine runs as N x M processes ("ranks").
``torchrun`` tells each one who it is through the environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``); without it the stage is the single process it
always was, and nothing here changes what it computes.

How the work is split, so that N ranks with batch b make the same update as one
process with batch N*b (up to floating point):

* every rank draws the *same* epoch plan (the numpy generator that orders the
  batches is seeded alike everywhere) with global batches of N*b rows, and takes
  its own strided shard of each (:meth:`World.shard`); the rows of a
  length-bucketed batch have similar lengths, so the shards do too;
* random numbers that belong to examples (SMART's random starts) are drawn for
  the whole global batch from a generator kept alike on every rank, and each rank
  keeps its rows' part, so an example's noise does not depend on the split;
* each rank scales its shard's mean loss by its share of the global batch
  (:meth:`World.loss_weight`), so that averaging gradients over the ranks (what
  ``DistributedDataParallel`` does, and what PCGrad does by hand before its
  projection) gives exactly the gradient of the global batch's mean loss;
* a rank whose shard of a small last batch is empty runs one row with weight
  zero, so that every rank takes part in every collective operation;
* evaluation shards whole batches across ranks and gathers the outputs, each row
  exactly once (:meth:`World.gather_rows`); every rank then holds the same
  metrics, so all take the same best-epoch decision;
* only rank 0 writes metrics, predictions and resumable states.

Dropout masks come from torch's global generator, seeded per rank (``seed +
rank``), so the ranks do not repeat each other's masks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


@dataclass(frozen=True)
class World:
    """This process's place among the data-parallel ranks (rank 0 of 1 by default)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ data

    def shard(self, batch_rows: int) -> np.ndarray:
        """This rank's positions in a global batch of ``batch_rows`` rows: every
        ``size``-th from ``rank`` (empty when the batch has fewer rows than ranks)."""
        return np.arange(self.rank, batch_rows, self.size)

    def loss_weight(self, local: int, total: int) -> float:
        """Factor on this rank's mean loss over ``local`` of the batch's ``total`` rows.

        Gradients are averaged over the ranks, so the factor is ``size * local /
        total``: the average of the weighted means is the mean over the whole
        batch. With one process it is 1.
        """
        return self.size * local / total

    # ------------------------------------------------------------ collectives

    def all_reduce_mean_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Average tensors over the ranks, in place, in one collective operation."""
        if not self.distributed or not tensors:
            return
        flat = _flatten_dense_tensors(list(tensors))
        dist.all_reduce(flat)
        flat /= self.size
        for t, averaged in zip(tensors, _unflatten_dense_tensors(flat, list(tensors))):
            t.copy_(averaged)

    def all_gather(self, obj):
        """Every rank's ``obj``, in rank order (a one-element list without torchrun)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def start(device_name: str = "auto") -> tuple[World, torch.device]:
    """Join the process group ``torchrun`` set up, if any, and pick this rank's device.

    One process per GPU (``cuda:LOCAL_RANK``, NCCL) on CUDA machines; gloo on CPUs.
    """
    from minbert.device import choose_device

    size = int(os.environ.get("WORLD_SIZE", "1"))
    world = World(
        rank=int(os.environ.get("RANK", "0")), size=size, local_rank=int(os.environ.get("LOCAL_RANK", "0"))
    )
    device = choose_device(device_name)
    if device.type == "cuda" and world.distributed:
        if world.local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK {world.local_rank} but only {torch.cuda.device_count()} "
                "CUDA devices: start at most one process per GPU"
            )
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    if world.distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return world, device


def stop(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def require_single_process(stage: str) -> None:
    """Stages that do not shard their work refuse to run as several copies."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1:
        raise SystemExit(
            f"stage {stage} runs in one process (WORLD_SIZE is {size}); "
            "only the multitask fine-tuning stages run under torchrun"
        )
