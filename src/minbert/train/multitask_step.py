"""One multitask training step: the host loads the batches (:meth:`MultitaskStep.load`),
the device trains on them, top to bottom (:meth:`MultitaskStep.train_on`). The loop
(``minbert.train.multitask``), the benchmarks in ``bench/`` and the CUDA-graph replay
(``minbert.train.graphed_step``) run the same object."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from minbert.data.batches import split_by_tokens
from minbert.data.multitask import Batch, TaskData
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


@dataclasses.dataclass
class LoadedPiece:
    """One task's batch (or a piece of it, ``of`` pieces in all) on the device: ``k`` the
    task's index in MULTITASK_TASKS, ``rows`` the global batch, ``positions`` this piece's
    places in it and ``weight`` its share of the mean."""

    k: int
    task: str
    rows: np.ndarray
    positions: np.ndarray
    weight: float
    of: int
    batch: Batch
    labels: torch.Tensor


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
        capturable: bool = False,
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
            capturable=capturable,  # an optimizer step a CUDA graph can record (GraphedStep)
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

    def visit_orders(self, k: int) -> torch.Tensor:
        """PCGrad's (k, k) task visit orders for the next step, drawn on the host from
        ``pcgrad_generator`` (one draw a PCGrad step), on the device."""
        if self.pcgrad is None:
            raise ValueError("visit orders are PCGrad's; this step sums its tasks' gradients")
        return self.pcgrad.visit_orders(k)

    def __call__(
        self, rows_by_task: dict[str, np.ndarray], epoch: int = 0, step: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Train on one global batch of each task in ``rows_by_task`` (one task per round-robin
        step). Returns the (task, LOSS_PARTS) global means (zeros for untrained tasks) and
        PCGrad's Gram matrix, both on the device; a non-finite loss raises
        ``NonFiniteLoss`` (on a GPU one step late, or at :meth:`flush`)."""
        step_losses, _, gram = self.train_on(self.load(rows_by_task), at=(epoch, step))
        return step_losses, gram

    def load(self, rows_by_task: dict[str, np.ndarray]) -> list[LoadedPiece]:
        """The host's part of a step: each task's padded batch (in pieces above ``max_tokens``)
        and labels, sent to the device without waiting for them."""
        loaded = []
        for k, task in enumerate(MULTITASK_TASKS):
            if task in rows_by_task:
                rows, data = rows_by_task[task], self.train[task]
                pieces = self.pieces(task, rows)
                for positions, weight in pieces:
                    batch = data.batch(rows[positions], self.pad_multiple).to(self.device)
                    labels = to_device(data.labels(batch.rows), self.device)
                    loaded.append(LoadedPiece(k, task, rows, positions, weight, len(pieces), batch, labels))
        return loaded

    def train_on(
        self, loaded: list[LoadedPiece], at: tuple[int, int] | None = None, orders: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The device's part of a step, top to bottom; nothing here waits for the device or
        reads the host's data, so a CUDA graph can hold it (``GraphedStep``). Returns the
        global and this rank's (task, LOSS_PARTS) means and PCGrad's Gram matrix. ``at``:
        the (epoch, step) under which the losses go to the non-finite guard (None: the
        caller checks them). ``orders``: PCGrad's visit orders (None: drawn here)."""
        objectives = []
        local = torch.zeros(len(MULTITASK_TASKS), len(LOSS_PARTS), device=self.device)
        # Cleared first: a batch cut into pieces backpropagates each piece as it goes.
        self.optimizer.zero_grad(set_to_none=True)
        with self.no_sync():
            # 1. Each task's loss, plus SMART's smoothness and Bregman terms; a batch above
            # `max_tokens` in pieces whose graphs are freed one by one (gradients add up).
            for piece in loaded:
                terms = self.task_objective(piece)
                self.observer.objective(piece.task, terms, self.model)
                if piece.of == 1:
                    objectives.append(piece.weight * terms.objective)
                else:
                    (piece.weight * terms.objective).backward()
                local[piece.k] += piece.weight * terms.parts()

            # 2. The global batch's mean of each part, for the log and the non-finite check.
            step_losses = local.clone()
            self.world.all_reduce_mean_([step_losses])
            if at is not None:
                self.guard.push(step_losses, (*at, rows_used(loaded)), local)

            # 3. Backward: the sum of the tasks' objectives (one task in a round-robin
            # step), or PCGrad's surgery on the encoder's per-task gradients.
            gram = None
            if self.pcgrad is not None:
                orders = self.visit_orders(len(objectives)) if orders is None else orders
                gram = self.pcgrad(objectives, orders)
            elif objectives:
                torch.stack(objectives).sum().backward()

        # 4. Clipping, 5. the optimizer step, 6. SMART's teacher follows the student.
        if self.settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.optimizer.step()
        if self.smart is not None:
            self.smart.teacher.update(self.model)
        return step_losses, local, gram

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

    def task_objective(self, piece: LoadedPiece) -> TaskObjective:
        """The objective (SMART's terms added) of one loaded piece of a task's global batch."""
        task, batch, labels, smart, device = piece.task, piece.batch, piece.labels, self.smart, self.device
        with compute_context(device):
            embedded = self.model.embed(batch)
        if smart is None:
            with compute_context(device):
                output = self.net(task, batch, embedded)
            return TaskObjective.without_smart(task_loss(task, output, labels))
        # The ascent starts from noise drawn for the whole global batch.
        start = smart.start(self.train[task], piece.rows, piece.positions, batch)
        return smart(self.net, task, batch, embedded, labels, start)

    def flush(self) -> None:
        """Check the last step's losses (at the end of an epoch)."""
        self.guard.check()


def rows_used(loaded: list[LoadedPiece]) -> dict[str, np.ndarray]:
    """Each task's table rows this process trained on in a step (for error messages)."""
    used: dict[str, np.ndarray] = {}
    for piece in loaded:
        rows = piece.batch.rows
        used[piece.task] = np.concatenate([used.get(piece.task, rows[:0]), rows])
    return used


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
