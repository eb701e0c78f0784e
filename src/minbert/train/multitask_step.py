"""One multitask training step (``MultitaskStep``), the object the loop and the benchmarks
in ``bench/`` both run (its settings: ``minbert.settings.MultitaskSettings``).

Summed losses: ``DistributedDataParallel`` averages the gradients during the backward
pass. PCGrad takes per-task gradients with ``autograd.grad``, which DDP does not
see, so it runs without DDP's synchronisation and averages each task's gradient
itself. Round-robin steps leave the other tasks' heads without a gradient, which
DDP must be told to expect.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from minbert.data.multitask import TaskData
from minbert.device import pad_multiple, to_device
from minbert.distributed import World
from minbert.model.multitask import MultitaskBert
from minbert.settings import MultitaskSettings
from minbert.tasks import MULTITASK_TASKS
from minbert.train.loop import NonFiniteGuard
from minbert.train.objective import LOSS_PARTS, smart_start, task_objective
from minbert.train.optim import build_optimizer
from minbert.train.pcgrad import PCGrad
from minbert.train.smart import EmaTeacher

GRADIENT_MODES = ("round-robin", "summed", "pcgrad")


class MultitaskStep:
    """One training step, as ``train_multitask`` runs it: the objective of each task
    the step trains on (its loss, plus SMART's terms when on) over this rank's share
    of the task's global batch, the backward pass (PCGrad's with ``pcgrad``), gradient
    clipping, the optimizer step and SMART's teacher update. The benchmarks in
    ``bench/`` time this same object.
    """

    def __init__(
        self,
        settings: MultitaskSettings,
        model: MultitaskBert,
        train: dict[str, TaskData],
        device: torch.device,
        world: World = World(),
    ):
        self.settings, self.model, self.train, self.device, self.world = (
            settings,
            model,
            train,
            device,
            world,
        )
        # Summed losses: DDP averages the gradients during the backward pass. PCGrad
        # takes per-task gradients with autograd.grad, which DDP does not see, so it
        # runs without DDP's synchronisation and averages each task's gradient itself.
        # Round-robin steps leave the other tasks' heads without a gradient, which DDP
        # must be told to expect.
        self.net = model
        if world.distributed:
            self.net = DistributedDataParallel(
                model,
                device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=settings.gradient == "round-robin",
            )
        self.no_sync = (
            self.net.no_sync
            if world.distributed and settings.gradient == "pcgrad"
            else contextlib.nullcontext
        )
        self.optimizer = build_optimizer(
            settings.optimizer,
            model,
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            head_lr=settings.head_lr,
        )
        self.teacher = EmaTeacher(model, settings.smart.beta) if settings.smart else None
        self.pcgrad_generator = torch.Generator().manual_seed(settings.seed)
        # PCGrad operates on the shared encoder; each head keeps its own task's gradient.
        self.pcgrad = (
            PCGrad(
                [p for p in model.encoder.parameters() if p.requires_grad],
                [list(model.heads[t].parameters()) for t in MULTITASK_TASKS],
                self.pcgrad_generator,
                world.all_reduce_mean_,
            )
            if settings.gradient == "pcgrad"
            else None
        )
        # SMART's random starts, drawn for whole global batches: alike on every rank.
        self.smart_generator = torch.Generator(device).manual_seed(settings.seed)
        # Checks each step's losses (global means) and names the examples of a bad one.
        self.guard = NonFiniteGuard(lambda at, local: _non_finite(world, at, local, train))
        self.pad_multiple = pad_multiple(device)

    @property
    def generators(self) -> tuple[torch.Generator, torch.Generator]:
        return self.pcgrad_generator, self.smart_generator

    def __call__(
        self, rows_by_task: dict[str, np.ndarray], epoch: int = 0, step: int = 0
    ) -> tuple[torch.Tensor, dict | None]:
        """Train on one global batch of each task in ``rows_by_task`` (row indices into
        ``train``; one task per round-robin step, all three otherwise).

        Returns a (task, LOSS_PARTS) tensor on the device: each trained task's mean
        loss and SMART terms over its global batch (zeros for the other tasks) and,
        with PCGrad, the Gram matrix of the task gradients (on the device; nothing in
        the step waits for the host). A non-finite loss
        raises :class:`NonFiniteLoss` (on a GPU, during the next call or :meth:`flush`).
        """
        world, smart, gram = self.world, self.settings.smart, None
        objectives, rows_used = [], {}
        local = torch.zeros(len(MULTITASK_TASKS), len(LOSS_PARTS), device=self.device)
        with self.no_sync():
            for k, task in enumerate(MULTITASK_TASKS):
                if task not in rows_by_task:
                    continue
                rows = rows_by_task[task]
                positions = world.shard(len(rows))
                weight = world.loss_weight(len(positions), len(rows))
                # A rank left without rows of a small last batch runs one row with
                # weight zero: every rank joins every collective.
                if not len(positions):
                    positions = np.zeros(1, dtype=int)
                data = self.train[task]
                batch = data.batch(rows[positions], self.pad_multiple).to(self.device)
                labels = to_device(data.labels(batch.rows), self.device)
                start = (
                    None
                    if smart is None
                    else smart_start(
                        data,
                        rows,
                        positions,
                        batch,
                        self.model.encoder.config.hidden_size,
                        smart.noise_std,
                        self.smart_generator,
                        self.pad_multiple,
                    )
                )
                objective, parts = task_objective(
                    self.model, self.net, self.teacher, smart, task, batch, labels, self.device, start
                )
                objectives.append(weight * objective)
                local[k] = weight * parts.detach()
                rows_used[task] = batch.rows
            step_losses = local.clone()
            if world.distributed:
                # The global batch's mean of each task's losses, for the log and the check.
                dist.all_reduce(step_losses)
                step_losses /= world.size
            self.guard.push(step_losses, (epoch, step, rows_used), local)
            self.optimizer.zero_grad(set_to_none=True)
            if self.pcgrad is not None:
                gram = self.pcgrad(objectives)
            else:
                torch.stack(objectives).sum().backward()
        if self.settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.optimizer.step()
        if self.teacher is not None:
            self.teacher.update(self.model)
        return step_losses, gram

    def flush(self) -> None:
        """Check the last step's losses (at the end of an epoch)."""
        self.guard.check()


def _non_finite(world: World, at: tuple, local_losses: torch.Tensor, train: dict[str, TaskData]) -> str:
    """The step, the task and the example ids of a bad batch, from every rank (each
    rank sees the same non-finite global losses, so all of them gather)."""
    epoch, step, rows = at
    local = [
        f"task {task}; batch example ids: {', '.join(train[task].table.ids[i] for i in rows[task])}"
        for task, parts in zip(MULTITASK_TASKS, local_losses)
        if task in rows and not bool(torch.isfinite(parts).all())
    ]
    found = [
        f"rank {rank}, {what}" if world.distributed else what
        for rank, found in enumerate(world.all_gather(local))
        for what in found
    ]
    return f"non-finite loss at epoch {epoch}, step {step}, " + " | ".join(found)
