"""One multitask training step, top to bottom (:meth:`MultitaskStep.__call__`); the loop
(``minbert.train.multitask``) and the benchmarks in ``bench/`` run the same object."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from minbert.data.batches import split_by_tokens
from minbert.data.multitask import TaskData
from minbert.device import compute_context, pad_multiple, to_device
from minbert.distributed import World
from minbert.model.multitask import MultitaskBert, task_loss
from minbert.results import EpochScores
from minbert.settings import MultitaskSettings
from minbert.tasks import MULTITASK_TASKS
from minbert.train.loop import NonFiniteGuard
from minbert.train.optim import build_optimizer
from minbert.train.pcgrad import PCGrad
from minbert.train.smart import LOSS_PARTS, EmaTeacher, Smart, TaskObjective


class MultitaskObserver:
    """What a benchmark or test may watch in a multitask run (as a ``TrainerCallback`` does);
    every method here does nothing. ``objective``: each task's terms in each step, before the
    backward pass (their graphs still held); ``epoch``: each epoch's scores (0: the start,
    ``minbert.train.multitask.EpochScores``), with the model and SMART's teacher (None
    without SMART)."""

    def objective(self, task: str, terms: TaskObjective, model: MultitaskBert) -> None:
        pass

    def epoch(self, scores: EpochScores, model: MultitaskBert, teacher: EmaTeacher | None) -> None:
        pass


class MultitaskStep:
    """The model, its optimizer, SMART, PCGrad and the non-finite-loss guard. Under several
    processes summed losses go through DDP; PCGrad's per-task ``autograd.grad`` runs
    without DDP's synchronisation and averages each task's gradient itself; round-robin
    leaves the other heads without a gradient, which DDP is told to expect."""

    def __init__(
        self,
        settings: MultitaskSettings,
        model: MultitaskBert,
        train: dict[str, TaskData],
        device: torch.device,
        world: World = World(),
        observer: MultitaskObserver | None = None,
    ):
        self.settings, self.model, self.train, self.device, self.world = settings, model, train, device, world
        self.observer = observer or MultitaskObserver()
        self.net = model
        if world.distributed:
            self.net = DistributedDataParallel(
                model,
                device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=settings.gradient == "round-robin",
            )
        pcgrad = settings.gradient == "pcgrad"
        self.no_sync = self.net.no_sync if world.distributed and pcgrad else contextlib.nullcontext
        self.optimizer = build_optimizer(
            settings.optimizer,
            model,
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            head_lr=settings.head_lr,
        )
        self.pad_multiple = pad_multiple(device)
        self.smart = (
            Smart(settings.smart, model, device, settings.seed, self.pad_multiple) if settings.smart else None
        )
        # PCGrad operates on the shared encoder; each head keeps its own task's gradient.
        self.pcgrad_generator = torch.Generator().manual_seed(settings.seed)
        self.pcgrad = (
            PCGrad(
                [p for p in model.encoder.parameters() if p.requires_grad],
                [list(model.heads[t].parameters()) for t in MULTITASK_TASKS],
                self.pcgrad_generator,
                world.all_reduce_mean_,
            )
            if pcgrad
            else None
        )
        self.guard = NonFiniteGuard(lambda at, local: _non_finite(world, at, local, train))

    @property
    def generators(self) -> tuple[torch.Generator, ...]:
        return (self.pcgrad_generator, *([self.smart.generator] if self.smart else []))

    def __call__(
        self, rows_by_task: dict[str, np.ndarray], epoch: int = 0, step: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Train on one global batch of each task in ``rows_by_task`` (one task per round-robin
        step). Returns the (task, LOSS_PARTS) global means (zeros for untrained tasks) and
        PCGrad's Gram matrix, both on the device; a non-finite loss raises
        ``NonFiniteLoss`` (on a GPU one step late, or at :meth:`flush`)."""
        objectives, rows_used = [], {}
        local = torch.zeros(len(MULTITASK_TASKS), len(LOSS_PARTS), device=self.device)
        # Cleared first: a batch cut into pieces backpropagates each piece as it goes.
        self.optimizer.zero_grad(set_to_none=True)
        with self.no_sync():
            # 1. Each task's loss, plus SMART's smoothness and Bregman terms; a batch above
            # `max_tokens` in pieces whose graphs are freed one by one (gradients add up).
            for k, task in enumerate(MULTITASK_TASKS):
                if task in rows_by_task:
                    pieces = self.pieces(task, rows_by_task[task])
                    for positions, weight in pieces:
                        terms, used = self.task_objective(task, rows_by_task[task], positions)
                        self.observer.objective(task, terms, self.model)
                        if len(pieces) == 1:
                            objectives.append(weight * terms.objective)
                        else:
                            (weight * terms.objective).backward()
                        local[k] += weight * terms.parts()
                        rows_used[task] = np.concatenate([rows_used.get(task, used[:0]), used])

            # 2. The global batch's mean of each part, for the log and the non-finite check.
            step_losses = local.clone()
            self.world.all_reduce_mean_([step_losses])
            self.guard.push(step_losses, (epoch, step, rows_used), local)

            # 3. Backward: the sum of the tasks' objectives (one task in a round-robin
            # step), or PCGrad's surgery on the encoder's per-task gradients.
            gram = None
            if self.pcgrad is not None:
                gram = self.pcgrad(objectives)
            elif objectives:
                torch.stack(objectives).sum().backward()

        # 4. Clipping, 5. the optimizer step, 6. SMART's teacher follows the student.
        if self.settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.optimizer.step()
        if self.smart is not None:
            self.smart.teacher.update(self.model)
        return step_losses, gram

    def pieces(self, task: str, rows: np.ndarray) -> list[tuple[np.ndarray, float]]:
        """This rank's positions in ``task``'s global batch ``rows`` with the weight that makes
        the ranks' mean the whole batch's: one share, or, above ``max_tokens`` padded tokens,
        pieces of it whose weights add up to the share's."""
        positions, weight = self.world.share(len(rows))
        lengths = self.train[task].lengths[rows[positions]]
        cut = split_by_tokens(np.arange(len(positions)), lengths, self.settings.max_tokens)
        if len(cut) == 1:
            return [(positions, weight)]
        # PCGrad needs each task's whole graph, and DDP one backward per forward.
        if self.pcgrad is not None or self.world.distributed:
            raise ValueError(
                f"max_tokens: {task}'s batch of {len(rows)} rows up to {int(lengths.max())} tokens "
                f"exceeds {self.settings.max_tokens}; a batch is cut into pieces only in one "
                "process without PCGrad (raise max_tokens, or 0 for no limit)"
            )
        return [(positions[piece], weight * len(piece) / len(positions)) for piece in cut]

    def task_objective(
        self, task: str, rows: np.ndarray, positions: np.ndarray
    ) -> tuple[TaskObjective, np.ndarray]:
        """The objective (SMART's terms added) of the rows at ``positions`` of ``task``'s global
        batch ``rows``, and those rows."""
        data, smart, device = self.train[task], self.smart, self.device
        batch = data.batch(rows[positions], self.pad_multiple).to(device)
        labels = to_device(data.labels(batch.rows), device)
        with compute_context(device):
            embedded = self.model.embed(batch)
        if smart is None:
            with compute_context(device):
                output = self.net(task, batch, embedded)
            terms = TaskObjective.without_smart(task_loss(task, output, labels))
        else:  # the ascent starts from noise drawn for the whole global batch
            start = smart.start(data, rows, positions, batch)
            terms = smart(self.net, task, batch, embedded, labels, start)
        return terms, batch.rows

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
