"""Data-parallel training under ``torchrun`` (``DistributedDataParallel``), so that N ranks
with batch b make the update one process makes with N*b: same epoch plan, strided shards,
losses weighted by their share, evaluation gathered once per row, only rank 0 writing.
Without ``torchrun`` nothing here changes what a stage computes. How: docs/scaling.md."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from minbert.cores import threads_each


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

    def share(self, batch_rows: int) -> tuple[np.ndarray, float]:
        """This rank's positions in a global batch of ``batch_rows`` rows (every ``size``-th
        from ``rank``) and the factor on its mean loss that makes the ranks' average the
        whole batch's mean (``size * local / total``). A rank left without rows of a small
        last batch runs the first row with weight zero: every rank joins every collective."""
        positions = np.arange(self.rank, batch_rows, self.size)
        weight = self.size * len(positions) / batch_rows
        return (positions if len(positions) else np.zeros(1, dtype=int)), weight

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
    """Join ``torchrun``'s process group, if any, and pick this rank's device (CUDA: one per
    rank with NCCL; CPUs: gloo, each rank with its share of the cores)."""
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
    if device.type == "cpu" and world.distributed:
        # The ranks on this machine share its cores (torchrun's own default is one thread
        # each, whatever the cores): each takes cores ÷ ranks here.
        torch.set_num_threads(threads_each(int(os.environ.get("LOCAL_WORLD_SIZE", size))))
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
