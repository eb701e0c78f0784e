"""Dropout that gives stacked copies of a batch the same masks (SMART's clean and perturbed
copies, docs/smart.md): inside :func:`tiled`, every dropout, attention's included, draws
its mask for one copy with ``bernoulli_`` and applies it to each; outside, it is
``nn.Dropout`` and SDPA. A :class:`MaskTape` gives later passes the first pass's masks."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

_COPIES: contextvars.ContextVar[int | None] = contextvars.ContextVar("dropout_copies", default=None)
_TAPE: contextvars.ContextVar[MaskTape | None] = contextvars.ContextVar("dropout_tape", default=None)


@contextlib.contextmanager
def tiled(copies: int) -> Iterator[None]:
    """Inside the block, a batch is ``copies`` stacked copies sharing their dropout masks."""
    if copies < 1:
        raise ValueError(f"copies must be at least 1, got {copies}")
    token = _COPIES.set(copies)
    try:
        yield
    finally:
        _COPIES.reset(token)


class MaskTape:
    """One step's dropout masks (one copy's each): the first pass under :meth:`play` draws
    and records them, every later pass replays them in order. Nothing rewinds a
    generator, which a CUDA graph's capture forbids."""

    def __init__(self) -> None:
        self.masks: list[torch.Tensor] = []
        self.recorded = False
        self._next = 0

    @contextlib.contextmanager
    def play(self, copies: int = 1) -> Iterator[None]:
        """Run the block as :func:`tiled` (``copies``), its masks the tape's."""
        self._next = 0
        token = _TAPE.set(self)
        try:
            with tiled(copies):
                yield
        finally:
            _TAPE.reset(token)
        if self.recorded and self._next != len(self.masks):
            raise RuntimeError(f"a pass replayed {self._next} of the tape's {len(self.masks)} dropout masks")
        self.recorded = True

    def keep(self, shape: tuple[int, ...], x: torch.Tensor, p: float) -> torch.Tensor:
        """The next mask, ``shape`` for ``x``: drawn (and recorded) or replayed."""
        if not self.recorded:
            self.masks.append(_draw(shape, x, p))
            return self.masks[-1]
        if self._next == len(self.masks):
            raise RuntimeError(f"a pass asked for more than the tape's {len(self.masks)} dropout masks")
        mask = self.masks[self._next]
        self._next += 1
        if mask.shape != shape:
            raise RuntimeError(f"the tape's mask is {tuple(mask.shape)}, a pass's {tuple(shape)}")
        return mask.to(x.dtype)


def _draw(shape: tuple[int, ...], x: torch.Tensor, p: float) -> torch.Tensor:
    keep = torch.empty(shape, dtype=x.dtype, device=x.device)
    return keep.bernoulli_(1.0 - p).div_(1.0 - p)


def in_tiled() -> bool:
    """Whether the caller runs inside :func:`tiled`."""
    return _COPIES.get() is not None


def tiled_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout of ``x`` whose mask is drawn for one copy of the batch and
    repeated for every copy (``x``'s first dimension holds the copies, one after the other)."""
    copies = _COPIES.get() or 1
    if x.shape[0] % copies:
        raise ValueError(f"a batch of {x.shape[0]} rows is not {copies} copies of one")
    shape = (x.shape[0] // copies, *x.shape[1:])
    tape = _TAPE.get()
    keep = _draw(shape, x, p) if tape is None else tape.keep(shape, x, p)
    if copies > 1:
        keep = keep.repeat(copies, *([1] * (x.dim() - 1)))
    return x * keep


class Dropout(nn.Dropout):
    """``nn.Dropout``, with masks shared across copies inside :func:`tiled`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _COPIES.get() is None or not self.training or self.p == 0.0:
            return super().forward(x)
        return tiled_dropout(x, self.p)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """Scaled dot-product attention (``attn_mask``: SDPA's "may attend"); inside
    :func:`tiled` as explicit operators, whose dropout mask copies share."""
    if _COPIES.get() is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    probabilities = scores.softmax(dim=-1)
    return (tiled_dropout(probabilities, dropout_p) if dropout_p else probabilities) @ v
