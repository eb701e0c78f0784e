"""SMART's smoothness-inducing adversarial term: the perturbation, its ascent and R_s.

What the term is, and where each of its choices comes from (the paper's Algorithm 1,
its authors' reference implementation), is said once, in ``minbert.train.smart``'s
docstring; this module holds the computation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD

from minbert.model.dropout import tiled
from minbert.settings import SmartSettings
from minbert.train.smart import Kind, divergence


class DropoutMasks:
    """The global random state at one moment, to draw the same dropout masks again.

    Built just before the clean forward pass (after the embedding layer, whose
    output the perturbed passes reuse). Every pass run under :meth:`replay` starts
    from that state: the same modules drawing masks of the same shapes in the same
    order draw the same masks, so a perturbed pass differs from the clean one only
    by its perturbation. Holds the CPU state and, for a CUDA device, that device's
    state (dropout and SDPA's attention dropout draw from it).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.cpu_state = torch.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Run the block from the saved state, then put the global state back.

        ``torch.random.fork_rng`` saves the current state and restores it on exit,
        so the random stream after a replayed pass is what it would have been
        without it: the perturbed passes draw nothing from the training's stream.
        """
        cuda = self.cuda_state is not None
        with torch.random.fork_rng(devices=[self.device] if cuda else [], device_type="cuda"):
            self.rewind()
            yield

    def rewind(self) -> None:
        """Put the global random state back to the saved one, for the pass that draws
        the masks for the training's own stream (which then goes on from there)."""
        torch.set_rng_state(self.cpu_state)
        if self.cuda_state is not None:
            torch.cuda.set_rng_state(self.cuda_state, self.device)


def _perturbed_pass(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    masks: DropoutMasks | None,
    copies: int = 1,
    replay: bool = True,
    tiling: bool = False,
) -> torch.Tensor:
    """``forward_fn(embedded)`` as SMART's passes run it: in float32 with autocast off (a
    perturbation added to order-one embeddings does not survive bf16's 8-bit mantissa).
    With ``masks`` (shared masks), the pass starts from the saved random state (replayed
    and put back, or with ``replay`` False rewound and left to go on) and draws its masks
    for one copy of the batch, however many ``copies`` ``embedded`` stacks
    (``minbert.model.dropout.tiled``); ``tiling`` runs one copy through those explicit
    operators without shared masks too. The output is float32."""
    if masks is None:
        state = contextlib.nullcontext()
    elif replay:
        state = masks.replay()
    else:
        masks.rewind()
        state = contextlib.nullcontext()
    explicit = tiled(copies) if masks is not None or tiling else contextlib.nullcontext()
    with torch.autocast(embedded.device.type, enabled=False), state, explicit:
        return forward_fn(embedded.float()).float()


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


def _unit_inf_norm(x: torch.Tensor, dim: int | tuple[int, ...]) -> torch.Tensor:
    """``x`` divided by its infinity norm over ``dim`` (largest coordinate: 1).

    A zero slice stays zero rather than becoming 0/0 = NaN: the smallest normal
    float as the divisor changes nothing else.
    """
    scale = x.abs().amax(dim=dim, keepdim=True)
    return x / scale.clamp_min(torch.finfo(scale.dtype).tiny)


def project(noise: torch.Tensor, settings: SmartSettings) -> torch.Tensor:
    """Bound a perturbation of shape (batch, tokens, hidden) as ``settings.projection`` says.

    * ``"ball"``: clamp every coordinate into ``[-epsilon, epsilon]``, the
      projection onto the infinity-norm ball of the paper's Algorithm 1.
    * ``"token"``: scale each token's vector to infinity norm ``token_norm``, as
      the reference code's ``_norm_grad`` does (with norm 1). A token whose
      perturbation is zero stays zero.
    """
    if settings.projection == "ball":
        return noise.clamp(-settings.epsilon, settings.epsilon)
    return settings.token_norm * _unit_inf_norm(noise, dim=-1)


def divergence_curvature(clean: torch.Tensor, change: torch.Tensor, kind: Kind) -> torch.Tensor:
    """The divergence's second derivative at ``clean``, applied to an output ``change``:
    ``H @ change`` with ``H`` the Hessian of ``divergence(a, clean)`` in ``a`` at ``a = clean``.

    It is the gradient of ``divergence(clean + change, clean)`` to first order in
    ``change``, computed without forming ``clean + change``: in float32 that sum would
    round away most of a change 1e-5 the size of ``clean``.
    """
    return torch.func.jvp(torch.func.grad(lambda a: divergence(a, clean, kind)), (clean,), (change,))[1]


def ascent_gradient(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    noise: torch.Tensor,
    kind: Kind,
    masks: DropoutMasks | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient in ``noise`` of ``divergence(f(embedded + noise), f(embedded))``, taken on
    the divergence's second-order model at the clean input (J' H J noise, J the Jacobian of
    the output in the input), and the clean output f(embedded) it is taken at.

    Differencing two passes would divide float32 rounding (1e-7 of the output) by the
    output change a 1e-5 start causes: 7-30% of that gradient on all-MiniLM-L6-v2, in
    digits that differ between CPUs. Here one pass carries J noise as a forward-mode
    derivative (no difference taken) and one backward pass applies J'; the error is
    then float32's own, and the model's is of the order of ``noise`` (docs/smart.md).
    """
    x = embedded.detach().requires_grad_(True)
    with fwAD.dual_level():
        # tiled(1): attention and dropout as explicit operators, which forward mode supports.
        dual = _perturbed_pass(forward_fn, fwAD.make_dual(x, noise), masks, tiling=True)
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
    masks: DropoutMasks | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate the inner max of R_s: the perturbation the ascent finds, and the clean
    output (float32, detached) it was found against.

    Normalised gradient ascent on the divergence between the perturbed and the clean
    prediction, the paper's Algorithm 1: start from N(0, sigma^2) noise, and
    ``steps`` times move the noise by ``step_size`` times its gradient divided by
    that gradient's infinity norm, then bound it with :func:`project`. The gradient is
    :func:`ascent_gradient`'s, normalised per example for the ``"ball"`` projection (the
    paper's) and per token for ``"token"``, whose bound is per token: there a token with
    a small gradient still moves in its own steepest direction.

    Only the noise moves: the gradient is taken with respect to it alone, so the ascent
    leaves every parameter's ``.grad`` untouched. Returns the final perturbation
    (float32), detached. The passes run through :func:`_perturbed_pass`: float32, and
    with ``masks`` the clean pass's dropout masks.

    ``start`` is the random start, when the caller draws it (data-parallel training
    draws it for the whole batch, so that each example's start does not depend on
    how the batch was split); otherwise it is drawn here with ``generator``.
    """
    embedded = embedded.detach().float()
    if start is None:
        noise = initial_noise(embedded, settings.noise_std, generator)
    elif start.shape != embedded.shape:
        raise ValueError(
            f"start has shape {tuple(start.shape)}, the embedding output {tuple(embedded.shape)}"
        )
    else:
        noise = start.to(embedded.dtype)
    # The ascent's step: per example for the paper's ball, per token for "token".
    norm_dims = tuple(range(1, embedded.dim())) if settings.projection == "ball" else -1
    clean = None
    for _ in range(settings.steps):
        grad, clean = ascent_gradient(forward_fn, embedded, noise, kind, masks)
        # Normalising by the infinity norm makes the step size meaningful: the raw
        # gradient of a divergence this close to its minimum is tiny, and its scale
        # also depends on the batch size (the divergence is a batch mean). Its
        # largest coordinate then moves by exactly step_size.
        with torch.no_grad():
            noise = project(noise + settings.step_size * _unit_inf_norm(grad, norm_dims), settings)
    return noise.detach(), clean


def smoothness_terms(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    masks: DropoutMasks | None = None,
    **random_start: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The clean output, R_s and its control for one batch.

    ``forward_fn(embedded)`` maps an embedding output to the task's predictions (it
    closes over the attention mask and the task head) and accepts several copies of
    the batch stacked along the first dimension (outputs copy after copy);
    ``embedded`` is this batch's embedding output, in the graph. ``masks``, taken
    before any pass of the batch, makes every pass use the same dropout masks
    (``dropout_masks="shared"``); ``random_start`` is the ascent's ``generator`` or
    ``start``, as :func:`adversarial_perturbation` takes them. Three passes, all float32:

    1. the ascent (:func:`adversarial_perturbation`): a forward pass carrying the
       output's derivative along the perturbation, whose primal is the clean output
       (detached, the control's target), and a backward pass to the perturbation;
    2. one pass over the clean and the perturbed copies stacked, with the graph: the
       clean output (returned, for the task loss and the Bregman term) and R_s, the
       divergence between the two halves. It keeps the graph on *both* sides, as the
       paper's objective differentiates ``l_s(f(x~; theta), f(x; theta))`` in both
       arguments (with a symmetric divergence neither side is privileged); only the
       perturbation is a constant, chosen by the ascent;
    3. none more for the control: the divergence between pass 2's clean half and pass
       1's primal, the same divergence with no perturbation, detached. It is the part of
       R_s that is not the perturbation's doing: 0 with shared masks (up to the
       rounding of a stacked batch), what dropout alone causes with independent ones.

    Stacking pass 2 rather than running the clean and the perturbed pass apart halves
    the operators a GPU launches for them (``bench/step_ops.py``); with shared masks
    the stacked copies draw one set of masks (``minbert.model.dropout``).
    """
    embedded32 = embedded.float()
    noise, target = adversarial_perturbation(
        forward_fn, embedded32, kind, settings, masks=masks, **random_start
    )
    # The pass that draws this step's masks for the training's stream (the others replayed them).
    both = _perturbed_pass(forward_fn, torch.cat([embedded32, embedded32 + noise]), masks, 2, replay=False)
    clean, perturbed = both.chunk(2)
    with torch.no_grad():
        control = divergence(clean, target, kind)
    return clean, divergence(perturbed, clean, kind), control
