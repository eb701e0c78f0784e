"""A multitask step replayed from CUDA graphs, one per batch shape: at batches of 2
sentences the host paces a GPU step (docs/performance.md, "CUDA graphs")."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch

from minbert.tasks import MULTITASK_TASKS
from minbert.train.multitask_step import LoadedPiece, MultitaskStep, rows_used
from minbert.train.optim import AdamaxW
from minbert.train.smart import LOSS_PARTS

# capture(fn, generators) records fn's device work without running it and returns what
# replays it; each replay draws on from where ``generators`` stand (others would repeat).
Capture = Callable[[Callable[[], None], Sequence[torch.Generator]], Callable[[], None]]


class CudaGraphs:
    """Captures CUDA graphs that share one memory pool (safe in any replay order: see
    docs/performance.md). Once every graph of a pool is dropped, PyTorch frees the pool
    and refuses another capture into it (an internal assert): graphs dropped, a new
    CudaGraphs."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, fn: Callable[[], None], generators: Sequence[torch.Generator]) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        for generator in generators:  # registered before capture: each replay advances them
            if generator.device.type == "cuda":
                graph.register_generator_state(generator)
        with torch.cuda.graph(graph, pool=self.pool):
            fn()
        return graph.replay


@dataclasses.dataclass
class _Captured:
    """One shape's graph: the device tensors its replays read and write."""

    replay: Callable[[], None]
    inputs: list[LoadedPiece]
    losses: torch.Tensor
    local: torch.Tensor
    orders: torch.Tensor | None = None  # PCGrad's visit orders in, its Gram matrix out
    gram: torch.Tensor | None = None

    def fill(self, loaded: list[LoadedPiece], orders: torch.Tensor | None = None) -> None:
        if orders is not None and self.orders is not None:
            self.orders.copy_(orders, non_blocking=True)
        for static, piece in zip(self.inputs, loaded):
            static.batch.ids.copy_(piece.batch.ids, non_blocking=True)
            static.batch.mask.copy_(piece.batch.mask, non_blocking=True)
            if static.batch.token_types is not None:
                static.batch.token_types.copy_(piece.batch.token_types, non_blocking=True)
            static.labels.copy_(piece.labels, non_blocking=True)


def shape_key(loaded: list[LoadedPiece]) -> tuple:
    """What a graph fixes about a step's batches (an unpadded one runs without a mask)."""
    return tuple(
        (
            p.task,
            tuple(p.batch.ids.shape),
            p.batch.token_types is not None,
            p.batch.padded,
            tuple(p.labels.shape),
            p.weight,
            p.of,
        )
        for p in loaded
    )


class GraphedStep:
    """``MultitaskStep``'s device work as CUDA graph replays, called as the step is: a
    shape's first step eager (its warm-up), its second captured, then replayed. What a
    graph fixes and what is refused: docs/performance.md, "CUDA graphs"."""

    def __init__(self, step: MultitaskStep, new_capture: Callable[[], Capture] = CudaGraphs):
        why = refusal(step)
        if why:
            raise ValueError(f"CUDA graphs: {why}")
        self.step = step
        self.new_capture = new_capture
        self.capture = new_capture()
        self.graphs: dict[tuple, _Captured] = {}
        self.seen: set[tuple] = set()
        self.eager_steps = 0
        # One side stream for every eager step: the allocator reuses a stream's blocks only
        # on that stream.
        self.side = torch.cuda.Stream(step.device) if step.device.type == "cuda" else None

    def __call__(
        self, rows_by_task: dict[str, np.ndarray], epoch: int = 0, step: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        loaded = self.step.load(rows_by_task)
        key = shape_key(loaded)
        if key not in self.seen:
            self.seen.add(key)
            losses, local, gram = self._eager(loaded)
        else:
            captured = self.graphs.get(key) or self._capture(key, loaded)
            captured.fill(loaded, self.visit_orders(loaded))
            captured.replay()
            # The static outputs are overwritten by the next replay; the guard reads later.
            losses, local = captured.losses.clone(), captured.local.clone()
            gram = None if captured.gram is None else captured.gram.clone()
        self.step.guard.push(losses, (epoch, step, rows_used(loaded)), local)
        return losses, gram

    def visit_orders(self, loaded: list[LoadedPiece]) -> torch.Tensor | None:
        """PCGrad's visit orders for a replay, drawn on the host as the eager step draws them
        (a graph would otherwise replay its capture's orders); None without PCGrad."""
        return None if self.step.pcgrad is None else self.step.visit_orders(len(loaded))

    def reset(self) -> None:
        """Forget every graph, and their memory pool (after fused AdamW's rate changes)."""
        # Fused AdamW's rate is a float, a constant of its graphs; AdamaxW's is read on the device.
        self.graphs.clear()
        self.seen.clear()
        self.capture = self.new_capture()

    def _eager(self, loaded: list[LoadedPiece]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        self.eager_steps += 1
        if self.side is None:
            return self.step.train_on(loaded)
        self.side.wait_stream(torch.cuda.current_stream(self.step.device))
        with torch.cuda.stream(self.side):
            out = self.step.train_on(loaded)
        torch.cuda.current_stream(self.step.device).wait_stream(self.side)
        return out

    def _capture(self, key: tuple, loaded: list[LoadedPiece]) -> _Captured:
        inputs = [_static_copy(p) for p in loaded]
        shape = (len(MULTITASK_TASKS), len(LOSS_PARTS))
        losses = torch.zeros(shape, device=self.step.device)
        local = torch.zeros(shape, device=self.step.device)
        orders = gram = None
        if self.step.pcgrad is not None:  # every piece a task's whole batch: k = len(loaded)
            k = len(loaded)
            # Any valid orders until each replay's fill draws the step's own.
            orders = torch.arange(k, device=self.step.device).repeat(k, 1)
            gram = torch.zeros(k, k, dtype=torch.float64, device=self.step.device)

        def step() -> None:
            step_losses, step_local, step_gram = self.step.train_on(inputs, orders=orders)
            losses.copy_(step_losses)
            local.copy_(step_local)
            if gram is not None:
                gram.copy_(step_gram)

        # Optimizers refuse capture unless marked capturable; fused AdamW's step counts live
        # on the device either way, and its kernel is the same (the mark is off again after,
        # as PyTorch warns of capturable steps run eagerly). AdamaxW is built capturable.
        unmarked = [g for g in self.step.optimizer.param_groups if not g.get("capturable")]
        for group in unmarked:
            group["capturable"] = True
        try:
            captured = _Captured(
                self.capture(step, device_generators(self.step)), inputs, losses, local, orders, gram
            )
        finally:
            for group in unmarked:
                group["capturable"] = False
        self.graphs[key] = captured
        return captured


def device_generators(step: MultitaskStep) -> list[torch.Generator]:
    """The generators ``step``'s device work draws from: dropout's (the device's default)
    and SMART's random starts'."""
    device = step.device
    if device.type == "cuda":
        default = torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()
        ]
    else:
        default = torch.default_generator
    return [default, *([step.smart.generator] if step.smart is not None else [])]


def drawn_from(step: MultitaskStep) -> list[torch.Generator]:
    """Every generator ``step`` draws from: the device's and PCGrad's host one."""
    return list({id(g): g for g in (*device_generators(step), *step.generators)}.values())


def refusal(step: MultitaskStep) -> str | None:
    """Why ``step`` cannot run from graphs, or None."""
    if step.world.distributed:
        return "several processes: DDP's communication is not captured here"
    optimizer = step.optimizer
    capturable = all(group.get("capturable") for group in optimizer.param_groups)
    if isinstance(optimizer, AdamaxW) and capturable:
        return None  # its rate and step counts on the device
    if isinstance(optimizer, torch.optim.AdamW) and (optimizer.defaults.get("fused") or capturable):
        return None
    return (
        f"the optimizer is {type(optimizer).__name__}{' (not capturable)' if not capturable else ''}; "
        "only fused AdamW and AdamaxW or AdamW built capturable are captured"
    )


def _static_copy(piece: LoadedPiece) -> LoadedPiece:
    """``piece`` with device tensors of its own, which each replay refills."""
    batch = piece.batch
    types = None if batch.token_types is None else batch.token_types.clone()
    static = dataclasses.replace(batch, ids=batch.ids.clone(), mask=batch.mask.clone(), token_types=types)
    return dataclasses.replace(piece, batch=static, labels=piece.labels.clone())


@dataclasses.dataclass(frozen=True)
class GraphCheck:
    """Graphed against eager training from one state (docs/performance.md, "CUDA graphs"):
    largest relative differences of the losses and weights, and of two eager runs."""

    steps: int
    loss_difference: float
    weight_difference: float
    eager_loss_difference: float
    eager_weight_difference: float

    # Within ten times what the device's own nondeterminism moves, or float32's rounding.
    @property
    def loss_tolerance(self) -> float:
        return max(10 * self.eager_loss_difference, 1e-5)

    @property
    def weight_tolerance(self) -> float:
        return max(10 * self.eager_weight_difference, 1e-6)

    @property
    def passed(self) -> bool:
        return self.loss_difference <= self.loss_tolerance and self.weight_difference <= self.weight_tolerance


def compare_with_eager(
    graphed: GraphedStep,
    plan: list[dict[str, np.ndarray]],
    generators: list[torch.Generator] | None = None,
) -> GraphCheck:
    """``plan`` trained three times from one state, dropout off: graphed, eager, eager
    again; the state (weights, optimizer, SMART's teacher, ``generators``: by default every
    one the step draws from) is restored after and the graphs dropped."""
    step, model = graphed.step, graphed.step.model
    teacher = [] if step.smart is None else [step.smart.teacher.module]
    state = [t for m in (model, *teacher) for t in (*m.parameters(), *m.buffers())]
    saved = [t.detach().clone() for t in state]
    # Deep copies: load_state_dict keeps the tensors it is given, and the runs may add state.
    optimizer = copy.deepcopy(step.optimizer.state_dict())
    # Each run draws the same numbers, and the check none of the training run's.
    generators = drawn_from(step) if generators is None else generators
    positions = [g.get_state() for g in generators]
    training = model.training

    def restore() -> None:
        with torch.no_grad():
            for t, s in zip(state, saved):
                t.copy_(s)
        step.optimizer.load_state_dict(copy.deepcopy(optimizer))
        for g, position in zip(generators, positions):
            g.set_state(position)
        graphed.reset()

    def run(train) -> tuple[torch.Tensor, list[torch.Tensor]]:
        restore()
        model.eval()
        losses = torch.stack([train(rows)[0].sum(dim=1) for rows in plan])
        return losses, [p.detach().clone() for p in model.parameters()]

    runs = [run(graphed), run(step), run(step)]
    step.flush()
    restore()
    model.train(training)

    def differences(a, b) -> tuple[float, float]:
        loss = ((a[0] - b[0]).abs().max() / b[0].abs().max().clamp_min(1e-12)).item()
        scale = max(p.abs().max().item() for p in b[1])
        weight = max((p - q).abs().max().item() for p, q in zip(a[1], b[1])) / scale
        return loss, weight

    return GraphCheck(len(plan), *differences(runs[0], runs[1]), *differences(runs[2], runs[1]))
