"""SMART (Jiang et al., 2020): a smoothness-inducing adversarial term R_s and a Bregman term
against a momentum teacher, added to each task's loss. :class:`Smart` holds what a run
keeps between steps (teacher, random starts' generator, the step's dropout masks); the
functions below it compute on any ``forward_fn`` from embeddings to predictions. Each
choice the paper leaves open, and what it measures: docs/smart.md."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn

from minbert.data.multitask import Batch, TaskData
from minbert.device import at_least_float32, compute_context
from minbert.model.dropout import MaskTape, tiled
from minbert.model.multitask import task_loss
from minbert.settings import SmartSettings
from minbert.tasks import HEAD_OUTPUTS, TASKS

# What the compared outputs are: a task's head output kind (minbert.tasks.HEAD_OUTPUTS).
Kind = Literal["multiclass", "binary", "regression"]
KINDS: tuple[str, ...] = tuple(HEAD_OUTPUTS)

# What a step logs per task: the task's own loss, then SMART's terms unweighted (zero
# without SMART): the smoothness term as trained, its control (the same divergence with no
# perturbation: what of the term is not the perturbation's doing; not trained) and the
# Bregman term.
LOSS_PARTS = ("loss", "adversarial", "adversarial_control", "bregman")


@dataclass(frozen=True)
class TaskObjective:
    """One task's objective on one batch, and its parts (``LOSS_PARTS``), in the graph."""

    objective: torch.Tensor  # what the step trains on
    loss: torch.Tensor
    adversarial: torch.Tensor
    adversarial_control: torch.Tensor
    bregman: torch.Tensor

    @classmethod
    def without_smart(cls, loss: torch.Tensor) -> TaskObjective:
        zero = torch.zeros((), device=loss.device)
        return cls(loss, loss, zero, zero, zero)

    def parts(self) -> torch.Tensor:
        """The parts in ``LOSS_PARTS``'s order, detached."""
        return torch.stack([getattr(self, part) for part in LOSS_PARTS]).detach()


class Smart:
    """SMART for one multitask run. Per task and step the training step calls the object
    (the task's objective with R_s and D_breg) on the ascent's random start
    (:meth:`start`); after the optimizer step, ``teacher.update``."""

    def __init__(
        self, settings: SmartSettings, model: nn.Module, device: torch.device, seed: int, multiple: int
    ):
        self.settings, self.device, self.multiple = settings, device, multiple
        # The ascent's passes run on the model itself, never through a DDP wrapper: DDP's
        # output hook has no forward-mode derivative, and the ascent needs no gradient sync.
        self.model = model
        self.teacher = EmaTeacher(model, settings.beta)
        # Random starts are drawn for whole global batches: alike on every rank.
        self.generator = torch.Generator(device).manual_seed(seed)
        self.hidden = model.encoder.config.hidden_size
        self.masks: MaskTape | None = None  # this step's, drawn by the ascent's first pass

    def __call__(
        self,
        net: nn.Module,
        task: str,
        batch: Batch,
        embedded: torch.Tensor,
        labels: torch.Tensor,
        start: torch.Tensor | None,
    ) -> TaskObjective:
        """The task's loss + lambda_s R_s + mu D_breg on ``batch`` (``embedded``: its embedding
        layer's output, this step's; ``net``: the model or its DDP wrapper)."""
        output, adversarial, control = self.smoothness(net, task, batch, embedded, start)
        # The loss before the Bregman term: the order autograd sums their gradients in.
        loss = task_loss(task, output, labels)
        bregman = self.bregman(task, batch, output)
        objective = loss + self.settings.lambda_s * adversarial + self.settings.mu * bregman
        return TaskObjective(objective, loss, adversarial, control, bregman)

    def start(self, data: TaskData, rows: np.ndarray, positions: np.ndarray, batch: Batch) -> torch.Tensor:
        """N(0, noise_std^2) noise for the whole global batch ``rows`` (its rows, its padded
        width), of which this rank keeps its ``positions`` and its own width: an example
        starts from the same noise however the batch is split across processes."""
        width = -(-int(data.lengths[rows].max()) // self.multiple) * self.multiple
        shape = (len(rows) * (2 if data.siamese else 1), width, self.hidden)
        noise = torch.randn(shape, generator=self.generator, device=self.device)
        noise = noise * self.settings.noise_std
        # Slices, not an index tensor (a blocking copy from the host every step).
        mine = _as_slice(positions)
        if data.siamese:
            first, second = noise[: len(rows)], noise[len(rows) :]
            return torch.cat([first[mine], second[mine]])[:, : batch.ids.shape[1]]
        return noise[mine, : batch.ids.shape[1]]

    def smoothness(
        self, net: nn.Module, task: str, batch: Batch, embedded: torch.Tensor, start: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The clean output (float32), R_s and its control (:func:`smoothness_terms`) with
        autocast off: the ascent on the model, the trained pass through ``net`` (the model
        or its DDP wrapper); shared masks on a new tape."""
        shared = self.settings.dropout_masks == "shared"
        self.masks = MaskTape() if shared else None
        with compute_context(self.device), torch.autocast(self.device.type, enabled=False):
            return smoothness_terms(
                lambda e: net(task, batch, e), embedded, TASKS[task].head_output, self.settings,
                start=start, masks=self.masks, ascent_fn=lambda e: self.model(task, batch, e),
            )  # fmt: skip

    def bregman(self, task: str, batch: Batch, output: torch.Tensor) -> torch.Tensor:
        """D_breg: the divergence of ``output`` from the teacher's (float32: early on the
        teacher is the student, and bf16 rounding would be most of the term)."""
        with compute_context(self.device), torch.autocast(self.device.type, enabled=False), torch.no_grad():
            target = self.teacher.module(task, batch).float()
        return bregman_loss(output, target, TASKS[task].head_output)


def _as_slice(positions: np.ndarray) -> slice:
    """``positions``, an increasing arithmetic progression, as the slice that selects it."""
    step = int(positions[1] - positions[0]) if len(positions) > 1 else 1
    as_slice = slice(int(positions[0]), int(positions[-1]) + 1, step)
    if step < 1 or not np.array_equal(positions, np.arange(as_slice.start, as_slice.stop, step)):
        raise ValueError(f"a rank's positions in its batch must be evenly spaced, got {positions.tolist()}")
    return as_slice


# --------------------------------------------------------------------- divergence


def divergence(a: torch.Tensor, b: torch.Tensor, kind: Kind) -> torch.Tensor:
    """Symmetric divergence of two batches of predictions, float32, summed over an example's
    outputs and averaged over the batch: symmetric KL of softmaxes (``multiclass``) or of
    a logit's two classes (``binary``), squared error (``regression``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown divergence kind {kind!r}; expected one of {', '.join(KINDS)}")
    if a.shape != b.shape:
        raise ValueError(f"cannot compare predictions of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a, b = at_least_float32(a), at_least_float32(b)
    if kind == "multiclass":
        # KL(p||q) + KL(q||p) = sum (p - q)(log p - log q); log_softmax keeps the logs finite.
        log_p, log_q = F.log_softmax(a, dim=-1), F.log_softmax(b, dim=-1)
        per_example = ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(dim=-1)
        return per_example.mean()
    if kind == "binary":
        # The same over two classes: log p - log(1 - p) is the logit itself, so the
        # divergence is (sigmoid(a) - sigmoid(b)) * (a - b), with no logarithm to overflow.
        per_element = (torch.sigmoid(a) - torch.sigmoid(b)) * (a - b)
    else:
        per_element = (a - b).square()
    return per_element.reshape(a.shape[0], -1).sum(dim=1).mean()


# ----------------------------------------------------- Bregman proximal point


class EmaTeacher:
    """The momentum teacher: a frozen eval-mode copy of the model, ``theta~ <- beta theta~ +
    (1 - beta) theta`` at each :meth:`update`. Not an ``nn.Module``, so that it stays out of
    the student's ``parameters()``, ``state_dict()`` and ``train()``."""

    def __init__(self, model: nn.Module, beta: float) -> None:
        self.beta = beta
        self.module = copy.deepcopy(model)
        self.module.requires_grad_(False)
        self.module.eval()
        for p in self.module.parameters():
            p.grad = None  # deepcopy copies any .grad the student had
        self._param_names = [name for name, _ in self.module.named_parameters()]
        self._params = list(self.module.parameters())
        self._buffers = list(self.module.buffers())

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the teacher towards ``model``; buffers are copied, not averaged."""
        named = list(model.named_parameters())
        if [name for name, _ in named] != self._param_names:
            raise ValueError("EmaTeacher.update: the model's parameters are not the teacher's")
        # lerp(t, s, 1 - beta) = beta t + (1 - beta) s, one fused call over all tensors.
        torch._foreach_lerp_(self._params, [p for _, p in named], 1.0 - self.beta)
        theirs = list(model.buffers())
        if theirs:
            torch._foreach_copy_(self._buffers, theirs)


def bregman_loss(student_output: torch.Tensor, teacher_output: torch.Tensor, kind: Kind) -> torch.Tensor:
    """D_breg for one batch; the teacher's side is a fixed target (detached)."""
    return divergence(student_output, teacher_output.detach(), kind)


# -------------------------------------------------------- smoothness term R_s


def initial_noise(
    embedded: torch.Tensor, std: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The ascent's random start: N(0, std^2) noise shaped like ``embedded`` (``generator``
    on its device)."""
    noise = torch.randn(embedded.shape, generator=generator, device=embedded.device, dtype=embedded.dtype)
    return noise * std


def _unit_inf_norm(x: torch.Tensor, dim: int | tuple[int, ...]) -> torch.Tensor:
    """``x`` over its infinity norm along ``dim``; a zero slice stays zero."""
    scale = x.abs().amax(dim=dim, keepdim=True)
    return x / scale.clamp_min(torch.finfo(scale.dtype).tiny)


def project(noise: torch.Tensor, settings: SmartSettings) -> torch.Tensor:
    """Bound a (batch, tokens, hidden) perturbation: ``ball`` clamps every coordinate into
    ``[-epsilon, epsilon]`` (the paper's Algorithm 1); ``token`` scales each token's vector
    to infinity norm ``token_norm`` (the reference code's ``_norm_grad``)."""
    if settings.projection == "ball":
        return noise.clamp(-settings.epsilon, settings.epsilon)
    return settings.token_norm * _unit_inf_norm(noise, dim=-1)


def divergence_curvature(clean: torch.Tensor, change: torch.Tensor, kind: Kind) -> torch.Tensor:
    """``H @ change``, ``H`` the Hessian of ``divergence(a, clean)`` in ``a`` at ``clean``:
    the gradient of ``divergence(clean + change, clean)`` to first order, without forming
    ``clean + change`` (float32 would round most of a small change away)."""
    return torch.func.jvp(torch.func.grad(lambda a: divergence(a, clean, kind)), (clean,), (change,))[1]


def ascent_gradient(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    noise: torch.Tensor,
    kind: Kind,
    masks: MaskTape | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient in ``noise`` of the divergence between ``f(embedded + noise)`` and
    ``f(embedded)``, on its second-order model J' H J noise (forward-mode J noise, one
    backward pass), and the clean output, detached."""
    x = embedded.detach().requires_grad_(True)
    # Explicit attention and dropout (tiled), which forward mode supports; float32.
    replayed = masks.play() if masks is not None else tiled(1)
    with fwAD.dual_level(), torch.autocast(embedded.device.type, enabled=False), replayed:
        dual = forward_fn(fwAD.make_dual(x, noise).float()).float()
        clean, change = fwAD.unpack_dual(dual)
    if change is None or not clean.requires_grad:  # a prediction that ignores its input
        return torch.zeros_like(noise), clean.detach()
    weights = divergence_curvature(clean.detach(), change.detach(), kind)
    with torch.autocast(embedded.device.type, enabled=False):
        (grad,) = torch.autograd.grad(clean, x, grad_outputs=weights, allow_unused=True)
    return (torch.zeros_like(noise) if grad is None else grad), clean.detach()


def adversarial_perturbation(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    generator: torch.Generator | None = None,
    start: torch.Tensor | None = None,
    masks: MaskTape | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inner max of R_s by normalised ascent from ``start`` (or noise drawn with
    ``generator``), then :func:`project`; the perturbation and the clean output it was
    found against, detached. No parameter's ``.grad`` is touched."""
    embedded = embedded.detach().float()
    if start is None:
        noise = initial_noise(embedded, settings.noise_std, generator)
    elif start.shape != embedded.shape:
        raise ValueError(
            f"start has shape {tuple(start.shape)}, the embedding output {tuple(embedded.shape)}"
        )
    else:
        noise = start.to(embedded.dtype)
    norm_dims = tuple(range(1, embedded.dim())) if settings.projection == "ball" else -1
    clean = None
    for _ in range(settings.steps):
        grad, clean = ascent_gradient(forward_fn, embedded, noise, kind, masks)
        # Over its infinity norm, the largest coordinate moves by exactly step_size: the raw
        # gradient near the divergence's minimum is tiny and scales with the batch.
        with torch.no_grad():
            noise = project(noise + settings.step_size * _unit_inf_norm(grad, norm_dims), settings)
    return noise.detach(), clean


def smoothness_terms(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    masks: MaskTape | None = None,
    start: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    ascent_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The clean output (in the graph), R_s and its control: the ascent (through
    ``ascent_fn``, by default ``forward_fn``: the same function, unwrapped), then one pass
    over the clean and perturbed copies stacked; the control is the divergence between
    that pass's clean half and the ascent's clean output (0 with shared ``masks``)."""
    embedded32 = embedded.float()
    noise, target = adversarial_perturbation(
        ascent_fn or forward_fn, embedded32, kind, settings, generator=generator, start=start, masks=masks
    )
    # The ascent's first pass drew the masks (with no ascent, this pass draws them).
    drawn = masks.play(2) if masks is not None else contextlib.nullcontext()
    with torch.autocast(embedded.device.type, enabled=False), drawn:
        both = forward_fn(torch.cat([embedded32, embedded32 + noise])).float()
    clean, perturbed = both.chunk(2)
    with torch.no_grad():
        control = divergence(clean, target, kind)
    return clean, divergence(perturbed, clean, kind), control
