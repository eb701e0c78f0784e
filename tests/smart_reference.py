"""SMART's shared dropout masks as they were before the mask tape (main 7084fbe), frozen for
tests: the global random state saved after the embedding layer and rewound for every
pass (``DropoutMasks``). The committed metrics were trained by this code; the tape must
reproduce it to the bit (tests/test_smart_graphs.py)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from unittest import mock

import torch
import torch.autograd.forward_ad as fwAD

from minbert.device import compute_context
from minbert.model import dropout
from minbert.model.dropout import tiled
from minbert.tasks import TASKS
from minbert.train.smart import _unit_inf_norm, divergence, divergence_curvature, initial_noise, project


def tiled_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    copies = dropout._COPIES.get() or 1
    if x.shape[0] % copies:
        raise ValueError(f"a batch of {x.shape[0]} rows is not {copies} copies of one")
    keep = torch.empty((x.shape[0] // copies, *x.shape[1:]), dtype=x.dtype, device=x.device)
    keep.bernoulli_(1.0 - p).div_(1.0 - p)
    if copies > 1:
        keep = keep.repeat(copies, *([1] * (x.dim() - 1)))
    return x * keep


class DropoutMasks:
    def __init__(self, device) -> None:
        self.device = torch.device(device)
        self.cpu_state = torch.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None

    @contextlib.contextmanager
    def replay(self, copies: int = 1) -> Iterator[None]:
        cuda = self.cuda_state is not None
        with torch.random.fork_rng(devices=[self.device] if cuda else [], device_type="cuda"):
            self.rewind()
            with tiled(copies):
                yield

    @contextlib.contextmanager
    def draw(self, copies: int = 1) -> Iterator[None]:
        self.rewind()
        with tiled(copies):
            yield

    def rewind(self) -> None:
        torch.set_rng_state(self.cpu_state)
        if self.cuda_state is not None:
            torch.cuda.set_rng_state(self.cuda_state, self.device)


def ascent_gradient(forward_fn, embedded, noise, kind, masks):
    x = embedded.detach().requires_grad_(True)
    replayed = masks.replay() if masks is not None else tiled(1)
    with fwAD.dual_level(), torch.autocast(embedded.device.type, enabled=False), replayed:
        dual = forward_fn(fwAD.make_dual(x, noise).float()).float()
        clean, change = fwAD.unpack_dual(dual)
    if change is None or not clean.requires_grad:
        return torch.zeros_like(noise), clean.detach()
    weights = divergence_curvature(clean.detach(), change.detach(), kind)
    with torch.autocast(embedded.device.type, enabled=False):
        (grad,) = torch.autograd.grad(clean, x, grad_outputs=weights, allow_unused=True)
    return (torch.zeros_like(noise) if grad is None else grad), clean.detach()


def adversarial_perturbation(forward_fn, embedded, kind, settings, generator=None, start=None, masks=None):
    embedded = embedded.detach().float()
    if start is None:
        noise = initial_noise(embedded, settings.noise_std, generator)
    else:
        noise = start.to(embedded.dtype)
    norm_dims = tuple(range(1, embedded.dim())) if settings.projection == "ball" else -1
    clean = None
    for _ in range(settings.steps):
        grad, clean = ascent_gradient(forward_fn, embedded, noise, kind, masks)
        with torch.no_grad():
            noise = project(noise + settings.step_size * _unit_inf_norm(grad, norm_dims), settings)
    return noise.detach(), clean


def smoothness_terms(
    forward_fn, embedded, kind, settings, masks=None, start=None, generator=None, ascent_fn=None
):
    embedded32 = embedded.float()
    noise, target = adversarial_perturbation(
        ascent_fn or forward_fn, embedded32, kind, settings, generator=generator, start=start, masks=masks
    )
    drawn = masks.draw(2) if masks is not None else contextlib.nullcontext()
    with torch.autocast(embedded.device.type, enabled=False), drawn:
        both = forward_fn(torch.cat([embedded32, embedded32 + noise])).float()
    clean, perturbed = both.chunk(2)
    with torch.no_grad():
        control = divergence(clean, target, kind)
    return clean, divergence(perturbed, clean, kind), control


def smoothness(self, net, task, batch, embedded, start):
    """``Smart.smoothness`` as it was."""
    shared = self.settings.dropout_masks == "shared"
    self.masks = DropoutMasks(embedded.device) if shared else None
    with compute_context(self.device), torch.autocast(self.device.type, enabled=False):
        return smoothness_terms(
            lambda e: net(task, batch, e), embedded, TASKS[task].head_output, self.settings,
            start=start, masks=self.masks, ascent_fn=lambda e: self.model(task, batch, e),
        )  # fmt: skip


@contextlib.contextmanager
def todays_code(smart) -> Iterator[None]:
    """``smart`` (a ``Smart``) and every dropout running the frozen code in the block."""
    smart.smoothness = types.MethodType(smoothness, smart)
    try:
        with mock.patch.object(dropout, "tiled_dropout", tiled_dropout):
            yield
    finally:
        del smart.smoothness
