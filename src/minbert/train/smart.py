r"""SMART regularisation for fine-tuning (Jiang et al., 2020).

Jiang, He, Chen, Liu, Gao and Zhao, "SMART: Robust and Efficient Fine-Tuning for
Pre-trained Natural Language Models through Principled Regularized Optimization",
ACL 2020. SMART adds two terms to the task loss:

**Smoothness-inducing adversarial regulariser** :math:`\mathcal{R}_s`, weight
:math:`\lambda_s`. The model's prediction should not change much when its input
moves a little:

.. math::
    \mathcal{R}_s(\theta) = \frac{1}{n}\sum_i
        \max_{\|\tilde x_i - x_i\|_\infty \le \epsilon}
        \ell_s\big(f(\tilde x_i;\theta),\, f(x_i;\theta)\big)

where :math:`x_i` is the *embedding output* (BERT's input is discrete, so the
perturbation lives in the continuous space right after the embeddings) and
:math:`\ell_s` is a symmetric divergence: symmetric KL for classification,
squared error for regression. The inner max is approximated by a few steps of
projected, normalised gradient ascent from a small random start
(:func:`adversarial_perturbation`); :func:`smoothness_loss` then evaluates
:math:`\ell_s` at the perturbation found, with the graph to the model kept so the
term regularises the parameters.

**Bregman proximal point term** :math:`\mathcal{D}_{breg}`, weight :math:`\mu`.
Each update should stay close, *in prediction space*, to a slowly moving
"teacher": an exponential moving average of the model's own parameters
(:class:`EmaTeacher`, the paper's momentum variant):

.. math::
    \mathcal{D}_{breg}(\theta, \tilde\theta_t) = \frac{1}{n}\sum_i
        \ell_s\big(f(x_i;\theta),\, f(x_i;\tilde\theta_t)\big),
    \qquad \tilde\theta_t = \beta\,\tilde\theta_{t-1} + (1-\beta)\,\theta_t .

This keeps aggressive updates from wrecking what the pre-trained model knew, the
"aggressive fine-tuning" failure the paper targets.

A training step combines them (per task, in multitask training)::

    embedded = bert.embed(input_ids, token_type_ids)
    logits = head(bert.encode(embedded, attention_mask))
    forward_fn = lambda e: head(bert.encode(e, attention_mask))
    loss = (task_loss(logits, labels)
            + settings.lambda_s * smoothness_loss(forward_fn, embedded, logits, kind, settings)
            + settings.mu * bregman_loss(logits, teacher_logits, kind))
    loss.backward(); optimizer.step(); teacher.update(model)

where ``teacher_logits`` come from the same batch run through ``teacher.module``
under ``torch.no_grad()``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Kind = Literal["multiclass", "binary", "regression"]
KINDS: tuple[str, ...] = ("multiclass", "binary", "regression")


@dataclass(frozen=True)
class SmartSettings:
    """Hyperparameters of SMART.

    Defaults are those of the paper's experiments (section 5, implementation
    details): perturbation radius ``epsilon`` = 1e-5, initial noise
    ``noise_std`` (sigma) = 1e-5, ascent step ``step_size`` (eta) = 1e-3, one
    ascent step (``steps``; the paper's T_x = 1, chosen for speed), ``mu`` = 1 and
    teacher momentum ``beta`` = 0.99. ``lambda_s`` was searched over {1, 3, 5} in
    the paper; 1 is the smallest of those. (The paper raises beta to 0.999 after
    the first 10% of updates; a caller wanting that builds new settings or sets
    :attr:`EmaTeacher.beta` itself.)

    ``lambda_s`` = 0 or ``mu`` = 0 switches that term off, so both only need to be
    non-negative. The others must be strictly positive: a zero noise_std starts
    the ascent where the divergence is at its minimum, so its gradient is zero
    and the ascent never moves.
    """

    lambda_s: float = 1.0
    epsilon: float = 1e-5
    noise_std: float = 1e-5
    step_size: float = 1e-3
    steps: int = 1
    mu: float = 1.0
    beta: float = 0.99

    def __post_init__(self) -> None:
        def fail(name: str, rule: str) -> None:
            raise ValueError(f"SmartSettings.{name} must be {rule}, got {getattr(self, name)!r}")

        for name in ("lambda_s", "epsilon", "noise_std", "step_size", "mu", "beta"):
            value = getattr(self, name)
            # bool is an int subclass; True as a weight is almost surely a mistake.
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                fail(name, "a number")
            if not math.isfinite(value):
                fail(name, "finite")
        for name in ("lambda_s", "mu"):
            if getattr(self, name) < 0:
                fail(name, ">= 0")
        for name in ("epsilon", "noise_std", "step_size"):
            if getattr(self, name) <= 0:
                fail(name, "> 0")
        if not 0 <= self.beta < 1:
            # beta = 1 would freeze the teacher at its initial weights forever.
            fail("beta", "in [0, 1)")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            fail("steps", "an integer >= 1")


# --------------------------------------------------------------------- divergence


def divergence(a: torch.Tensor, b: torch.Tensor, kind: Kind) -> torch.Tensor:
    """Symmetric divergence between two batches of predictions, averaged over the batch.

    ``kind`` says what the predictions are:

    * ``"multiclass"``: logits, classes on the last dimension; the symmetric KL
      ``KL(p||q) + KL(q||p)`` of their softmaxes.
    * ``"binary"``: one logit per example (shape ``(batch,)`` or ``(batch, 1)``),
      read as the two-class distribution ``(1 - sigmoid(z), sigmoid(z))``; the
      same symmetric KL.
    * ``"regression"``: scores; the squared error.

    Each example's divergence is summed over its outputs, then the mean is taken
    over the batch (every leading dimension for multiclass, the first for the
    others). Computed in float32 whatever the input dtype: in bf16 the tiny
    differences SMART's perturbations cause would round to zero.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown divergence kind {kind!r}; expected one of {', '.join(KINDS)}")
    if a.shape != b.shape:
        raise ValueError(f"cannot compare predictions of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a, b = a.float(), b.float()
    if kind == "multiclass":
        log_p, log_q = F.log_softmax(a, dim=-1), F.log_softmax(b, dim=-1)
        # KL(p||q) + KL(q||p) = sum p (log p - log q) + sum q (log q - log p)
        #                     = sum (p - q)(log p - log q),
        # one expression, with log_softmax keeping the logs finite for extreme logits.
        per_example = ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(dim=-1)
        return per_example.mean()
    if kind == "binary":
        # The same identity over the two classes (sigmoid(z), 1 - sigmoid(z)):
        # sum (p - q)(log p - log q) = (p - q)[(log p - log(1-p)) - (log q - log(1-q))]
        # and log p - log(1-p) is the logit itself, so it is exactly
        # (sigmoid(a) - sigmoid(b)) * (a - b), with no logarithm to overflow.
        per_element = (torch.sigmoid(a) - torch.sigmoid(b)) * (a - b)
    else:
        per_element = (a - b).square()
    return per_element.reshape(a.shape[0], -1).sum(dim=1).mean()


# ------------------------------------------------------ smoothness-inducing term


def initial_noise(
    embedded: torch.Tensor, std: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The ascent's random start: N(0, std^2) noise shaped like ``embedded``.

    A separate function so a test can draw the same start (same seed) and
    compare the divergence there with the one the ascent reaches. ``generator``
    must live on ``embedded``'s device.
    """
    noise = torch.randn(embedded.shape, generator=generator, device=embedded.device, dtype=embedded.dtype)
    return noise * std


def adversarial_perturbation(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    clean_output: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    generator: torch.Generator | None = None,
    start: torch.Tensor | None = None,
) -> torch.Tensor:
    """Approximate the inner max of R_s: a perturbation in the epsilon ball.

    Projected gradient ascent on the divergence between the perturbed and the
    clean prediction, the paper's Algorithm 1: start from N(0, sigma^2) noise, and
    ``steps`` times move the noise by ``step_size`` times its gradient divided by
    that gradient's infinity norm (per example), then clamp it into
    ``[-epsilon, epsilon]``, the projection onto the infinity-norm ball.

    Only the noise moves: ``embedded`` and ``clean_output`` are detached here, and
    the gradient is taken with :func:`torch.autograd.grad` with respect to the
    noise alone, so the ascent leaves every parameter's ``.grad`` untouched.
    Returns the final perturbation, detached.

    ``forward_fn`` runs in whatever mode the model is in; during training that
    means fresh dropout masks per call, as in the paper's implementation.

    ``start`` is the random start, when the caller draws it (data-parallel training
    draws it for the whole batch, so that each example's start does not depend on
    how the batch was split); otherwise it is drawn here with ``generator``.
    """
    embedded = embedded.detach()
    target = clean_output.detach()
    if start is None:
        noise = initial_noise(embedded, settings.noise_std, generator)
    elif start.shape != embedded.shape:
        raise ValueError(
            f"start has shape {tuple(start.shape)}, the embedding output {tuple(embedded.shape)}"
        )
    else:
        noise = start.to(embedded.dtype)
    for _ in range(settings.steps):
        noise.requires_grad_(True)
        loss = divergence(forward_fn(embedded + noise), target, kind)
        # A prediction that does not depend on the input (a constant head, say)
        # has no gradient path to the noise; that is a zero gradient, not an error.
        grad = None
        if loss.requires_grad:
            (grad,) = torch.autograd.grad(loss, noise, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(noise)
        # Normalising by the infinity norm makes the step size meaningful: the raw
        # gradient of a divergence this close to its minimum is tiny, and its scale
        # also depends on the batch size (the divergence is a batch mean). The
        # norm is per example so one example's scale doesn't shrink another's step.
        # Its largest coordinate then moves by exactly step_size.
        scale = grad.abs().reshape(grad.shape[0], -1).amax(dim=1)
        # A zero gradient (a model that ignores its input) must give a zero step,
        # not 0/0 = NaN; the smallest normal float changes nothing else.
        scale = scale.clamp_min(torch.finfo(scale.dtype).tiny)
        scale = scale.reshape(-1, *([1] * (grad.dim() - 1)))
        with torch.no_grad():
            noise = (noise + settings.step_size * grad / scale).clamp(-settings.epsilon, settings.epsilon)
    return noise.detach()


def smoothness_loss(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    clean_output: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    generator: torch.Generator | None = None,
    start: torch.Tensor | None = None,
) -> torch.Tensor:
    """R_s for one batch: the divergence at the adversarial perturbation (a scalar).

    ``forward_fn(embedded)`` maps an embedding batch to the task's predictions (it
    closes over the attention mask and the task head); ``embedded`` is this
    batch's embedding output and ``clean_output`` the unperturbed predictions,
    both still in the graph.

    The returned loss keeps the graph on *both* sides: through the perturbed
    forward pass (and through ``embedded`` into the embedding layer), and through
    ``clean_output``. The paper's objective differentiates
    ``l_s(f(x~; theta), f(x; theta))`` with respect to theta in both arguments,
    and with a symmetric divergence neither side is privileged, so neither is
    detached. Only the perturbation itself is a constant here: it was chosen by
    the ascent, and differentiating through that choice is not part of SMART.
    """
    noise = adversarial_perturbation(forward_fn, embedded, clean_output, kind, settings, generator, start)
    return divergence(forward_fn(embedded + noise), clean_output, kind)


# ----------------------------------------------------- Bregman proximal point


class EmaTeacher:
    """The momentum teacher of SMART's Bregman proximal point term.

    Holds a deep copy of the model whose parameters follow the student's as an
    exponential moving average, ``theta~ <- beta * theta~ + (1 - beta) * theta``,
    updated by the caller after every optimiser step with :meth:`update`.

    The copy is frozen (``requires_grad`` False: the optimiser must never see it,
    and the Bregman term differentiates only the student) and in eval mode, so
    its predictions are deterministic targets rather than dropout-noised ones.
    This class is deliberately not an ``nn.Module``: as a submodule of the
    student it would land in the student's ``parameters()``, ``state_dict()`` and
    ``train()`` calls. Build it after the model is on its device, and call
    ``update`` with that same model.
    """

    def __init__(self, model: nn.Module, beta: float) -> None:
        if not 0 <= beta < 1:
            raise ValueError(f"EmaTeacher beta must be in [0, 1), got {beta!r}")
        self.beta = beta
        self.module = copy.deepcopy(model)
        self.module.requires_grad_(False)
        self.module.eval()
        for p in self.module.parameters():
            p.grad = None  # deepcopy copies any .grad the student had
        self._param_names = [name for name, _ in self.module.named_parameters()]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the teacher towards ``model``: theta~ = beta*theta~ + (1-beta)*theta.

        Buffers (running statistics and the like) are copied, not averaged.
        """
        named = list(model.named_parameters())
        if [name for name, _ in named] != self._param_names:
            raise ValueError("EmaTeacher.update: the model's parameters are not the teacher's")
        teacher_params = list(self.module.parameters())
        # lerp(t, s, w) = t + w (s - t) = (1 - w) t + w s, so w = 1 - beta; one
        # fused call over all tensors rather than a Python loop of ~200 kernels.
        torch._foreach_lerp_(teacher_params, [p.detach() for _, p in named], 1.0 - self.beta)
        for mine, theirs in zip(self.module.buffers(), model.buffers(), strict=True):
            mine.copy_(theirs)


def bregman_loss(student_output: torch.Tensor, teacher_output: torch.Tensor, kind: Kind) -> torch.Tensor:
    """D_breg for one batch: divergence of the student's predictions from the teacher's.

    The teacher side is detached: it is a fixed target for this step (the
    proximal point), moved only by :meth:`EmaTeacher.update`.
    """
    return divergence(student_output, teacher_output.detach(), kind)
