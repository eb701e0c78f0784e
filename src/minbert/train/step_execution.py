"""How a run's multitask steps execute (``multitask.cuda_graphs``): replayed from CUDA graphs
once they train as the eager step does on the run's own first batches, else eager; the
run record says which and why (docs/performance.md, "CUDA graphs")."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from minbert.data.multitask import epoch_steps
from minbert.train.graphed_step import Capture, CudaGraphs, GraphedStep, compare_with_eager, refusal
from minbert.train.multitask_step import MultitaskStep

# Each batch of the check three times: its first step eager, its second captured and
# replayed, its third replayed.
CHECK_REPEATS = 3


def check_plan(
    lengths: dict[str, np.ndarray],
    batch: dict[str, int],
    seed: int,
    one_task_per_step: bool,
    batches_per_step: int = 1,
) -> list[dict[str, np.ndarray]]:
    """The check's steps: an epoch's first step of every task (drawn from a generator of
    its own, so the run's batches are not moved), each repeated."""
    rng, k = np.random.default_rng(seed), batches_per_step
    first = itertools.islice(
        epoch_steps(lengths, batch, rng, one_task_per_step=one_task_per_step, batches_per_step=k),
        len(lengths) if one_task_per_step else 1,
    )
    return [rows for rows in first for _ in range(CHECK_REPEATS)]


def choose_steps(
    step: MultitaskStep,
    cuda_graphs: bool,
    plan: list[dict[str, np.ndarray]],
    new_capture: Callable[[], Capture] | None = None,
) -> tuple[Callable, bool, str]:
    """The step to train with (``step`` or its ``GraphedStep``), whether it replays graphs,
    and why. ``new_capture``: a stand-in for CUDA's (tests), which waives the device."""

    def eager(why: str) -> tuple[Callable, bool, str]:
        return step, False, why

    if not cuda_graphs:
        return eager("eager: multitask.cuda_graphs is off")
    if new_capture is None and step.device.type != "cuda":
        return eager(f"eager: CUDA graphs need a CUDA device, the run's is {step.device.type}")
    if step.world.distributed:
        return eager("eager: several processes (DDP), whose communication is not captured")
    why = refusal(step)
    if why:
        return eager(f"eager: {why}")
    graphed = GraphedStep(step, new_capture or CudaGraphs)
    try:
        check = compare_with_eager(graphed, plan)
    except RuntimeError as error:  # a capture the device refused: the run goes on eager
        return eager(f"eager: capturing failed ({str(error).splitlines()[0]})")
    said = (
        f"{check.steps} steps against eager: losses apart by {check.loss_difference:.1e} "
        f"(tolerance {check.loss_tolerance:.1e}), weights by {check.weight_difference:.1e} "
        f"(tolerance {check.weight_tolerance:.1e})"
    )
    if not check.passed:
        return eager(f"eager: the graphs failed their check, {said}")
    return graphed, True, f"CUDA graphs, checked on the run's first batches: {said}"
