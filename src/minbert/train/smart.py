r"""SMART regularisation for fine-tuning (Jiang et al., 2020).

Jiang, He, Chen, Liu, Gao and Zhao, "SMART: Robust and Efficient Fine-Tuning for
Pre-trained Natural Language Models through Principled Regularized Optimization",
ACL 2020 (arXiv 1911.03437). SMART adds two terms to the task loss:

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
normalised gradient ascent from a small random start
(``minbert.train.smoothness.adversarial_perturbation``); ``smoothness_terms`` there
then evaluates :math:`\ell_s` at the perturbation found, with the graph to the model
kept so the term regularises the parameters.

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

What the smoothness term measures
---------------------------------

Three choices decide whether :math:`\mathcal{R}_s` measures the perturbation at
all; ``bench/smart_decomposition.py`` measures each on all-MiniLM-L6-v2 with
cross-encoder heads (``bench/results/smart_decomposition.json``; numbers below are
SST / Quora / STS, means over three batches of eight).

**How big the perturbation is** (``SmartSettings.projection``). The paper's
Algorithm 1 starts from :math:`x_i + \nu_i`, :math:`\nu_i \sim N(0, \sigma^2 I)`,
steps by :math:`\eta` times the gradient over its infinity norm,
and projects onto the infinity-norm ball of radius :math:`\epsilon` around
:math:`x_i`; its Section 5 sets :math:`\epsilon = \sigma = 10^{-5}`,
:math:`\eta = 10^{-3}`, one step. Taken literally (``projection="ball"``), the step
is a hundred times the radius, so every coordinate lands on the ball's surface:
:math:`\pm 10^{-5}` against embedding coordinates of order one (a token's largest
is 2.2 at the median). The divergence it causes, with dropout out of the way, is
1.2e-9 / 1.3e-9 / 6.9e-9: nothing for :math:`\lambda_s = 1` to train on. The
authors' reference implementation (github.com/namisan/mt-dnn,
``mt_dnn/perturbation.py``, ``SmartPerturbation.forward`` and
``SmartPerturbation._norm_grad``, with ``train.py``'s defaults ``adv_p_norm=inf``,
``adv_norm_level=0``, ``adv_epsilon=1e-6``) has no radius: after its step it divides
each token's vector by that token's largest coordinate plus ``adv_epsilon``, which
is only there to avoid dividing by zero. Every token's perturbation ends with
infinity norm 1. (mt-dnn's README gives it as the paper's code, so this is
presumably the size the paper's lambda_s in {1, 3, 5} went with.)
``projection="token"`` keeps that geometry: the step is the paper's normalised
gradient, normalised per token, and each token's perturbation is then scaled to
infinity norm ``token_norm``. The reference code's 1 (an L2 norm 0.55 of the token's
own; R_s 0.23 / 0.26 / 1.45) makes the term's gradient on the heads larger than the
task loss's from the first steps, and the heads collapse to one answer in short runs;
at 0.1 (R_s 0.023 / 0.025 / 0.12) they learn, but the validation score falls below the
start; the default, 0.01, is chosen on the validation split (docs/smart.md).
``epsilon`` keeps the paper's value and only the ``"ball"`` projection reads it.
(The reference code feeds ``embed + noise`` back through the embedding layer as
``inputs_embeds``, which adds the position and segment embeddings again and
renormalises; here the perturbed embeddings go straight to the encoder.) With
``"token"``, steps after the first move a perturbation of size ``token_norm`` by
``step_size``: they matter only with a step comparable to ``token_norm``.

**Dropout masks** (``SmartSettings.dropout_masks``). In training mode every pass
draws its own dropout masks, and two passes of the *same* input through different
masks already differ: without any perturbation, the divergence between them is
8.4e-3 / 4.5e-3 / 2.9e-2, the size of the whole term the old code trained
(1.1e-2 / 2.3e-3 / 2.9e-2, independent masks and the 1e-5 clamp): it regularised
dropout noise. The reference code draws fresh masks too (and recomputes the
embeddings for its perturbed passes). ``"shared"`` replays the clean pass's masks
in every perturbed pass (:class:`minbert.train.smoothness.DropoutMasks`), so that what the divergence sees
is the perturbation's doing alone; ``"independent"`` is the old behaviour, under
which the ascent also chases the masks (R_s 0.14 / 0.15 / 0.84 against 0.23 /
0.26 / 1.45 shared, with the token projection).

**Precision.** Under bf16 autocast the perturbed embeddings are rounded to bf16 at
the first matrix product, which keeps 8 bits of mantissa: 88% of the coordinates
of a 1e-5 perturbation vanish there, and the rest come out as whole rounding steps,
so R_s read rounding, not the perturbation. The perturbed passes therefore run with
autocast off (float32; TF32 matrix products, which would round alike, are off in
this project), the ascent's backward pass too (autograd runs it under the autocast
state of the call, not of the forward pass). The clean pass is one of them (stacked
with the perturbed copy), so every output a divergence compares is float32 (comparing
a bf16 output with a float32 one would measure the rounding), and the training
objective (``minbert.train.objective``) runs the teacher's pass in float32 too.

**Which side is differentiated.** The ascent compares with the clean output
detached (as the reference code's ``logits.detach()`` does); the final divergence
keeps the graph through both outputs, as the paper's objective differentiates
:math:`\ell_s(f(\tilde x; \theta), f(x; \theta))` in both arguments. (The
reference code's ``SymKlCriterion`` detaches the probabilities weighting each KL
term and differentiates both log-probabilities; the terms that drops vanish as
the two outputs meet.)

Every step also logs the *control*: the same divergence with no perturbation,
under the same mask policy (:func:`minbert.train.smoothness.smoothness_terms`). With
shared masks it is 0, and the trained term is the perturbation's; with independent
masks it is what dropout alone contributes.

A training step combines them (per task, in multitask training;
``minbert.train.objective.task_objective``)::

    embedded = model.embed(batch)
    masks = DropoutMasks(embedded.device)      # before any pass draws its masks
    forward_fn = lambda e: model(task, batch, e)   # e may stack several copies
    logits, adversarial, control = smoothness_terms(forward_fn, embedded, kind, settings, masks=masks)
    loss = (task_loss(logits, labels)
            + settings.lambda_s * adversarial
            + settings.mu * bregman_loss(logits, teacher_logits, kind))
    loss.backward(); optimizer.step(); teacher.update(model)

where ``teacher_logits`` come from the same batch run through ``teacher.module``
under ``torch.no_grad()``. ``smoothness_terms`` runs the clean and the perturbed
pass as one pass over the two copies stacked (``minbert.model.dropout`` gives them
one set of dropout masks).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from minbert.device import at_least_float32
from minbert.tasks import HEAD_OUTPUTS

# What the compared outputs are: a task's head output kind (minbert.tasks.HEAD_OUTPUTS).
Kind = Literal["multiclass", "binary", "regression"]
KINDS: tuple[str, ...] = tuple(HEAD_OUTPUTS)


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
    a, b = at_least_float32(a), at_least_float32(b)
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
        self._params = list(self.module.parameters())
        self._buffers = list(self.module.buffers())

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the teacher towards ``model``: theta~ = beta*theta~ + (1-beta)*theta.

        Buffers (running statistics and the like) are copied, not averaged.
        """
        named = list(model.named_parameters())
        if [name for name, _ in named] != self._param_names:
            raise ValueError("EmaTeacher.update: the model's parameters are not the teacher's")
        # lerp(t, s, w) = t + w (s - t) = (1 - w) t + w s, so w = 1 - beta; one
        # fused call over all tensors rather than a Python loop of ~200 kernels (no
        # gradient is recorded here, so the student's parameters need no detach).
        torch._foreach_lerp_(self._params, [p for _, p in named], 1.0 - self.beta)
        theirs = list(model.buffers())
        if theirs:
            torch._foreach_copy_(self._buffers, theirs)


def bregman_loss(student_output: torch.Tensor, teacher_output: torch.Tensor, kind: Kind) -> torch.Tensor:
    """D_breg for one batch: divergence of the student's predictions from the teacher's.

    The teacher side is detached: it is a fixed target for this step (the
    proximal point), moved only by :meth:`EmaTeacher.update`.
    """
    return divergence(student_output, teacher_output.detach(), kind)
