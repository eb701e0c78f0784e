"""Dropout that gives stacked copies of a batch the same masks (SMART's clean and perturbed
copies, docs/smart.md): inside :func:`tiled`, every dropout, attention's included, draws
its mask for one copy with ``bernoulli_`` and applies it to each; outside, it is
``nn.Dropout`` and SDPA."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

_COPIES: contextvars.ContextVar[int | None] = contextvars.ContextVar("dropout_copies", default=None)


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


def in_tiled() -> bool:
    """Whether the caller runs inside :func:`tiled`."""
    return _COPIES.get() is not None


def tiled_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout of ``x`` whose mask is drawn for one copy of the batch and
    repeated for every copy (``x``'s first dimension holds the copies, one after the other)."""
    copies = _COPIES.get() or 1
    if x.shape[0] % copies:
        raise ValueError(f"a batch of {x.shape[0]} rows is not {copies} copies of one")
    keep = torch.empty((x.shape[0] // copies, *x.shape[1:]), dtype=x.dtype, device=x.device)
    keep.bernoulli_(1.0 - p).div_(1.0 - p)
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
