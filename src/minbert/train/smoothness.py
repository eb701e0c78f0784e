"""SMART's smoothness-inducing adversarial term: the perturbation, its ascent and R_s.

What the term is, and where each of its choices comes from (the paper's Algorithm 1,
its authors' reference implementation), is said once, in ``minbert.train.smart``'s
docstring; this module holds the computation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from minbert.train.smart import Kind, SmartSettings, divergence


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
            torch.set_rng_state(self.cpu_state)
            if cuda:
                torch.cuda.set_rng_state(self.cuda_state, self.device)
            yield


def _perturbed_pass(
    forward_fn: Callable[[torch.Tensor], torch.Tensor], embedded: torch.Tensor, masks: DropoutMasks | None
) -> torch.Tensor:
    """``forward_fn(embedded)`` as SMART's perturbed passes run it: in float32 with
    autocast off (a perturbation added to order-one embeddings does not survive
    bf16's 8-bit mantissa), with the clean pass's dropout masks when ``masks`` is
    given. The output is float32."""
    replay = masks.replay() if masks is not None else contextlib.nullcontext()
    with torch.autocast(embedded.device.type, enabled=False), replay:
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


def adversarial_perturbation(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    clean_output: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    generator: torch.Generator | None = None,
    start: torch.Tensor | None = None,
    masks: DropoutMasks | None = None,
) -> torch.Tensor:
    """Approximate the inner max of R_s: the perturbation the ascent finds.

    Normalised gradient ascent on the divergence between the perturbed and the
    clean prediction, the paper's Algorithm 1: start from N(0, sigma^2) noise, and
    ``steps`` times move the noise by ``step_size`` times its gradient divided by
    that gradient's infinity norm, then bound it with :func:`project`. The
    gradient is normalised per example for the ``"ball"`` projection (the paper's)
    and per token for ``"token"``, whose bound is per token: there a token with a
    small gradient still moves in its own steepest direction rather than keeping
    its random start.

    Only the noise moves: ``embedded`` and ``clean_output`` are detached here, and
    the gradient is taken with :func:`torch.autograd.grad` with respect to the
    noise alone, so the ascent leaves every parameter's ``.grad`` untouched.
    Returns the final perturbation (float32), detached.

    The passes run through :func:`_perturbed_pass`: float32, and with ``masks``
    the clean pass's dropout masks; without, in whatever mode the model is in
    (fresh dropout masks per call during training).

    ``start`` is the random start, when the caller draws it (data-parallel training
    draws it for the whole batch, so that each example's start does not depend on
    how the batch was split); otherwise it is drawn here with ``generator``.
    """
    embedded = embedded.detach().float()
    target = clean_output.detach().float()
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
    for _ in range(settings.steps):
        noise.requires_grad_(True)
        loss = divergence(_perturbed_pass(forward_fn, embedded + noise, masks), target, kind)
        # A prediction that does not depend on the input (a constant head, say)
        # has no gradient path to the noise; that is a zero gradient, not an error.
        grad = None
        if loss.requires_grad:
            # The backward pass runs under the autocast state of this call, not of
            # the forward pass: off here too, or its products would be bf16.
            with torch.autocast(embedded.device.type, enabled=False):
                (grad,) = torch.autograd.grad(loss, noise, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(noise)
        # Normalising by the infinity norm makes the step size meaningful: the raw
        # gradient of a divergence this close to its minimum is tiny, and its scale
        # also depends on the batch size (the divergence is a batch mean). The
        # norm is per example (or per token) so one example's scale doesn't shrink
        # another's step. Its largest coordinate then moves by exactly step_size.
        with torch.no_grad():
            noise = project(noise + settings.step_size * _unit_inf_norm(grad, norm_dims), settings)
    return noise.detach()


def _smoothness(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    clean_output: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    generator: torch.Generator | None,
    start: torch.Tensor | None,
    masks: DropoutMasks | None,
    control: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if torch.is_autocast_enabled(embedded.device.type):
        # The caller's clean output went through bf16 products; against a float32
        # perturbed output the divergence would measure that rounding. The clean
        # side again, in float32 with the same masks (and the graph kept).
        reference = _perturbed_pass(forward_fn, embedded, masks)
    else:
        reference = clean_output.float()
    noise = adversarial_perturbation(forward_fn, embedded, reference, kind, settings, generator, start, masks)
    loss = divergence(_perturbed_pass(forward_fn, embedded + noise, masks), reference, kind)
    if not control:
        return loss, None
    with torch.no_grad():
        zero = divergence(_perturbed_pass(forward_fn, embedded, masks), reference, kind)
    return loss, zero


def smoothness_loss(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    clean_output: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    generator: torch.Generator | None = None,
    start: torch.Tensor | None = None,
    masks: DropoutMasks | None = None,
) -> torch.Tensor:
    """R_s for one batch: the divergence at the adversarial perturbation (a scalar).

    ``forward_fn(embedded)`` maps an embedding batch to the task's predictions (it
    closes over the attention mask and the task head); ``embedded`` is this
    batch's embedding output and ``clean_output`` the unperturbed predictions,
    both still in the graph. ``masks``, taken before the clean pass, makes every
    perturbed pass reuse its dropout masks (``dropout_masks="shared"``).

    The returned loss keeps the graph on *both* sides: through the perturbed
    forward pass (and through ``embedded`` into the embedding layer), and through
    ``clean_output`` (or, under autocast, through its float32 recomputation). The
    paper's objective differentiates ``l_s(f(x~; theta), f(x; theta))`` with
    respect to theta in both arguments, and with a symmetric divergence neither
    side is privileged, so neither is detached. Only the perturbation itself is a
    constant here: it was chosen by the ascent, and differentiating through that
    choice is not part of SMART.
    """
    loss, _ = _smoothness(
        forward_fn, embedded, clean_output, kind, settings, generator, start, masks, control=False
    )
    return loss


def smoothness_terms(
    forward_fn: Callable[[torch.Tensor], torch.Tensor],
    embedded: torch.Tensor,
    clean_output: torch.Tensor,
    kind: Kind,
    settings: SmartSettings,
    generator: torch.Generator | None = None,
    start: torch.Tensor | None = None,
    masks: DropoutMasks | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """R_s as :func:`smoothness_loss` computes it, and its control (detached).

    The control is the same divergence with *no* perturbation: one more pass of
    the unperturbed embeddings, under the same mask policy and precision, without
    a graph. It is the part of R_s that is not the perturbation's doing: 0 with
    shared masks (where the passes are the same computation), the divergence
    dropout alone causes with independent ones. Logged beside R_s, it shows what
    the trained term is made of.
    """
    loss, control = _smoothness(
        forward_fn, embedded, clean_output, kind, settings, generator, start, masks, control=True
    )
    return loss, control
