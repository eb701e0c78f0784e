"""The preamble of every stage that runs a model (sentiment, zero-shot, multitask, MLM):
pin the CPU code paths, join the data-parallel group (or refuse to run as several
processes), choose the device, find the checkpoint and say what it is; at its end, what
the stage measured of itself for a runner that asks (``MEASURES_ENV``)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from minbert import distributed
from minbert.device import choose_device, describe, pin_cpu_kernels
from minbert.model.checkpoint import describe_checkpoint, resolve_checkpoint
from minbert.progress import console
from minbert.settings import RunContext
from minbert.train.resume import ResumePoint, fingerprint

# A file the GPU node's runner names (minbert.offline.runner): the stage writes there its
# peak device memory and its threads, which its run records do not hold.
MEASURES_ENV = "MINBERT_STAGE_MEASURES"


@dataclass(frozen=True)
class Started:
    """A started stage: its processes, device, checkpoint directory and description."""

    world: distributed.World
    device: torch.device
    checkpoint_dir: Path
    checkpoint: dict  # minbert.model.checkpoint.describe_checkpoint

    def resume_point(self, directory: Path | None, name: str, settings, **data) -> ResumePoint:
        """Where the run saves its training state after every epoch, under ``directory``
        (None: nowhere). A state saved under other settings, checkpoint, device, number
        of processes or ``data`` is not resumed (``minbert.train.resume``)."""
        key = fingerprint(
            settings=asdict(settings),
            checkpoint=self.checkpoint,
            device=self.device.type,
            processes=self.world.size,
            **data,
        )
        return ResumePoint(directory, name, key)

    @property
    def device_name(self) -> str:
        """The device as metrics records write it (``2 x cpu (2 threads)`` under torchrun)."""
        one = describe(self.device)
        return one if self.world.size == 1 else f"{self.world.size} x {one}"


@contextlib.contextmanager
def started(
    context: RunContext,
    stage: str,
    data_parallel: bool = False,
    checkpoint_dir: Path | None = None,
    checkpoint_name: str | None = None,
) -> Iterator[Started]:
    """The preamble of a stage that runs a model (``context``: from its settings file), left
    with the process group closed. ``checkpoint_dir`` and ``checkpoint_name`` replace
    the configured checkpoint (a fine-tuning stage started from an MLM stage's output)."""
    if not data_parallel:
        distributed.require_single_process(stage)
    pin_cpu_kernels()  # before the first tensor operation
    if data_parallel:
        world, device = distributed.start(context.device)
    else:
        world, device = distributed.World(), choose_device(context.device)
    try:
        directory = Path(checkpoint_dir) if checkpoint_dir else resolve_checkpoint(context.checkpoint)
        begun = Started(
            world,
            device,
            directory,
            describe_checkpoint(checkpoint_name or context.checkpoint, directory),
        )
        if world.is_main:  # a line from the first second, before any long step
            named = f"{stage} {context.name}" if context.name else stage
            console.log(f"{named}: {begun.device_name}, checkpoint {begun.checkpoint['name']}")
        yield begun
        if os.environ.get(MEASURES_ENV) and world.is_main:
            cuda = device.type == "cuda"
            measured = {
                "peak_device_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
                "torch_threads": torch.get_num_threads(),
            }
            Path(os.environ[MEASURES_ENV]).write_text(json.dumps(measured) + "\n", encoding="utf-8")
    finally:
        distributed.stop(world)
