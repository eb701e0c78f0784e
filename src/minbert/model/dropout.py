"""Dropout that can give several stacked copies of a batch the same masks.

SMART (``minbert.train.smart``) compares the model's output on a batch with its output
on a perturbed copy of the batch under the same dropout masks, so that the divergence
measures the perturbation and not two draws of dropout. Run as two passes, the second
replays the first's random state. Run as one pass over the two copies stacked along
the batch dimension (half the operators, the same arithmetic), every dropout inside
:func:`tiled` draws its mask for one copy and applies it to each.

Outside :func:`tiled` :class:`Dropout` is ``nn.Dropout`` and attention dropout is
left to ``scaled_dot_product_attention``. Inside, with any number of copies, attention
runs as explicit operators and both masks are drawn explicitly with ``bernoulli_``, in
the same order and shapes for one copy or for several, so a pass over one copy draws
exactly the masks a pass over several copies applies to each (given the same random
state).
"""

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
    """Scaled dot-product attention over (batch, heads, tokens, head_dim); ``attn_mask`` is
    SDPA's boolean "may attend" mask. Inside :func:`tiled` the attention probabilities are
    computed here, so that their dropout mask can be shared across copies (and forward-mode
    derivatives pass, which SDPA's CPU kernel lacks); otherwise
    ``F.scaled_dot_product_attention`` (its fastest kernel) does it all."""
    if _COPIES.get() is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    probabilities = scores.softmax(dim=-1)
    return (tiled_dropout(probabilities, dropout_p) if dropout_p else probabilities) @ v
