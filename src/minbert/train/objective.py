"""One task's training objective on the shared encoder: its loss, plus SMART's terms.

SMART (``minbert.train.smart``) perturbs the embedding output of a task's batch,
compares the model's outputs with the divergence that fits the task, and pulls them
towards a momentum teacher's. Its random starts are drawn for a whole global batch,
so that an example starts from the same noise however a data-parallel run splits it.
With ``dropout_masks="shared"`` the random state is taken here, between the embedding
layer and the clean pass, so that the perturbed passes replay the clean pass's masks.
"""

from __future__ import annotations

import numpy as np
import torch

from minbert.data.multitask import Batch, TaskData
from minbert.device import compute_context
from minbert.model.multitask import task_loss
from minbert.settings import SmartSettings
from minbert.tasks import TASKS
from minbert.train.smart import bregman_loss
from minbert.train.smoothness import DropoutMasks, smoothness_terms

# What each training step logs per task: the task's own loss, then SMART's terms
# (unweighted; zero without SMART): the smoothness term as trained, its control (the
# same divergence with no perturbation, under the same dropout-mask policy: what of
# the term is not the perturbation's doing; not trained) and the Bregman term.
LOSS_PARTS = ("loss", "adversarial", "adversarial_control", "bregman")


def smart_start(
    data: TaskData,
    rows: np.ndarray,
    positions: np.ndarray,
    batch: Batch,
    hidden: int,
    std: float,
    generator: torch.Generator,
    multiple: int = 1,
) -> torch.Tensor:
    """SMART's random start for this rank's ``positions`` of a global batch of ``rows``.

    N(0, std^2) noise is drawn for the whole global batch (its rows, by its padded
    width) and this rank keeps its own rows and its own width: each example starts
    from the same noise however the batch is split across processes.
    """
    width = -(-int(data.lengths[rows].max()) // multiple) * multiple
    shape = (len(rows) * (2 if data.siamese else 1), width, hidden)
    noise = torch.randn(shape, generator=generator, device=generator.device) * std
    # This rank's rows as slices (every size-th row from its rank, or a lone row):
    # an index tensor would be a blocking copy from the host in every step.
    mine = _as_slice(positions)
    if data.siamese:
        first, second = noise[: len(rows)], noise[len(rows) :]
        return torch.cat([first[mine], second[mine]])[:, : batch.ids.shape[1]]
    return noise[mine, : batch.ids.shape[1]]


def _as_slice(positions: np.ndarray) -> slice:
    """``positions``, an increasing arithmetic progression, as the slice that selects it."""
    step = int(positions[1] - positions[0]) if len(positions) > 1 else 1
    as_slice = slice(int(positions[0]), int(positions[-1]) + 1, step)
    if step < 1 or not np.array_equal(positions, np.arange(as_slice.start, as_slice.stop, step)):
        raise ValueError(f"a rank's positions in its batch must be evenly spaced, got {positions.tolist()}")
    return as_slice


def task_objective(
    model,
    net,
    teacher,
    smart: SmartSettings | None,
    task,
    batch,
    labels,
    device,
    start: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's training objective and its LOSS_PARTS, unweighted (the log detaches them;
    ``bench/smart_collapse.py`` measures each one's gradient): the task loss, plus SMART's
    weighted smoothness and Bregman terms when SMART is on.

    ``net`` is the model itself, or its DistributedDataParallel wrapper: every pass
    that builds the graph goes through it. ``start`` is SMART's random start.
    """
    if smart is None:
        with compute_context(device):
            output = net(task, batch, model.embed(batch))
        loss = task_loss(task, output, labels)
        zero = torch.zeros((), device=loss.device)
        return loss, torch.stack([loss, zero, zero, zero])
    with compute_context(device):
        embedded = model.embed(batch)
        # After the embedding layer (its output is reused, masks and all), before the
        # clean pass draws the encoder's and the head's masks.
        masks = DropoutMasks(embedded.device) if smart.dropout_masks == "shared" else None
    kind = TASKS[task].head_output  # what SMART's divergence compares
    # SMART compares outputs in float32 (bf16 would round its perturbation away, see
    # minbert.train.smart): its passes, the clean one among them (stacked with the
    # perturbed copy, it serves the task loss too), run with autocast off. The teacher's
    # targets are float32 too: early on the teacher is the student, and bf16 rounding
    # would be most of the Bregman term.
    with compute_context(device), torch.autocast(device.type, enabled=False):
        output, adversarial, control = smoothness_terms(
            lambda e: net(task, batch, e), embedded, kind, smart, start=start, masks=masks
        )
        with torch.no_grad():
            target = teacher.module(task, batch).float()
    loss = task_loss(task, output, labels)
    bregman = bregman_loss(output, target, kind)
    objective = loss + smart.lambda_s * adversarial + smart.mu * bregman
    return objective, torch.stack([loss, adversarial, control, bregman])
