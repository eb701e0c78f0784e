"""Task heads on the shared encoder. Each reads one vector per sequence (``POOLINGS``:
BERT's pooler, or the mean of the final states over real tokens). Sentiment: dropout and
linear. Sentence pairs (``PAIR_HEADS``): siamese heads encode the two sentences apart (one
batch) and combine u and v (``concat(u,v)``, with ``|u-v|`` and/or ``u*v``, Reimers &
Gurevych, 2019; or 5 cos(u, v)); the cross-encoder encodes ``[CLS] a [SEP] b [SEP]`` once.
A pair head returns a paraphrase logit or a 0-5 similarity (``STS_OUTPUTS``: the logit,
or the paper's 5 sigmoid(logit))."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minbert.device import at_least_float32
from minbert.model.bert import BertModel, EncoderOutput
from minbert.model.dropout import Dropout
from minbert.settings import PAIR_HEADS, POOLINGS, STS_OUTPUTS
from minbert.tasks import TASKS


def _mean_of_real_tokens(output: EncoderOutput, attention_mask: torch.Tensor | None) -> torch.Tensor:
    hidden = at_least_float32(output.last_hidden_state)  # summed in float32, whatever autocast gave
    if attention_mask is None:
        return hidden.mean(dim=1)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


_POOL = {
    "pooler": lambda output, attention_mask: output.pooler_output,
    "mean": _mean_of_real_tokens,
}
assert tuple(_POOL) == POOLINGS, "every name of minbert.settings.POOLINGS has its pooling here"


def pool(output: EncoderOutput, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """One vector per sequence of the encoder's output, by the ``pooling`` named."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r} is not one of {sorted(POOLINGS)}")
    return _POOL[pooling](output, attention_mask)


def run_head(head: nn.Module, *features: torch.Tensor) -> torch.Tensor:
    """``head(*features)`` in float32, autocast off: bf16 would round logits to 8 bits and
    put STS scores on a grid 0.016-0.031 apart; a head costs nothing measurable."""
    with torch.autocast(features[0].device.type, enabled=False):
        return head(*(at_least_float32(f) for f in features))


class ClassificationHead(nn.Module):
    """Dropout then a linear layer: logits for ``num_classes`` classes."""

    def __init__(self, hidden_size: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)
        self.linear = nn.Linear(hidden_size, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(self.dropout(features))


class SentimentClassifier(nn.Module):
    """The encoder's pooled vector followed by a classification head."""

    def __init__(self, encoder: BertModel, num_classes: int, dropout: float, pooling: str = "pooler") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {sorted(POOLINGS)}")
        self.encoder = encoder
        self.pooling = pooling
        self.head = ClassificationHead(encoder.config.hidden_size, num_classes, dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = pool(self.encoder(input_ids, attention_mask), attention_mask, self.pooling)
        return run_head(self.head, pooled)


# How a linear head's logit becomes an STS score (see the module docstring).
STS_MAX = TASKS["sts"].score_range[1]  # the top of STS's 0-5 label scale


def _sts_score(logit: torch.Tensor, output: str) -> torch.Tensor:
    return STS_MAX * torch.sigmoid(logit) if output == "sigmoid" else logit


def _features(u: torch.Tensor, v: torch.Tensor, parts: tuple[str, ...]) -> torch.Tensor:
    pieces = {"u": lambda: u, "v": lambda: v, "absdiff": lambda: (u - v).abs(), "prod": lambda: u * v}
    return torch.cat([pieces[p]() for p in parts], dim=-1)


class SiameseLinearHead(nn.Module):
    """A linear score on features built from the two pooled vectors."""

    siamese = True

    def __init__(
        self, hidden_size: int, dropout: float, parts: tuple[str, ...], output: str = "linear"
    ) -> None:
        super().__init__()
        self.parts, self.output = parts, output
        self.dropout = Dropout(dropout)
        self.linear = nn.Linear(hidden_size * len(parts), 1)

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        logit = self.linear(self.dropout(_features(u, v, self.parts))).squeeze(-1)
        return _sts_score(logit, self.output)


class CosineHead(nn.Module):
    """``STS_MAX * cos(u, v)``, no parameters: trained with MSE against the label, the SBERT
    regression objective (why not ``2.5 * (cos + 1)``: docs/pipeline.md)."""

    siamese = True

    def __init__(self, hidden_size: int, dropout: float, output: str = "linear") -> None:
        super().__init__()

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return STS_MAX * F.cosine_similarity(u, v, dim=-1)


class CrossEncoderHead(nn.Module):
    """Dropout + linear on the pooled output of the packed pair."""

    siamese = False

    def __init__(self, hidden_size: int, dropout: float, output: str = "linear") -> None:
        super().__init__()
        self.output = output
        self.dropout = Dropout(dropout)
        self.linear = nn.Linear(hidden_size, 1)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return _sts_score(self.linear(self.dropout(pooled)).squeeze(-1), self.output)


# name -> constructor(hidden, dropout, output); the tasks each may serve are
# minbert.settings.PAIR_HEADS's.
_PAIR_HEAD = {
    "siamese-concat": lambda h, p, o: SiameseLinearHead(h, p, ("u", "v"), o),
    "siamese-concat-diff": lambda h, p, o: SiameseLinearHead(h, p, ("u", "v", "absdiff"), o),
    "siamese-concat-prod": lambda h, p, o: SiameseLinearHead(h, p, ("u", "v", "prod"), o),
    "siamese-concat-diff-prod": lambda h, p, o: SiameseLinearHead(h, p, ("u", "v", "absdiff", "prod"), o),
    "siamese-cosine": CosineHead,
    "cross-encoder": CrossEncoderHead,
}
assert set(_PAIR_HEAD) == set(PAIR_HEADS), "every pair head of minbert.settings is built here"


def build_pair_head(
    name: str, task: str, hidden_size: int, dropout: float, sts_output: str = "linear"
) -> nn.Module:
    """The pair head ``name`` for ``task``; ``sts_output`` (from ``STS_OUTPUTS``) applies
    to a linear head serving STS. A paraphrase head always outputs its logit."""
    if name not in PAIR_HEADS:
        raise ValueError(f"pair head {name!r} is not one of {sorted(PAIR_HEADS)}")
    if sts_output not in STS_OUTPUTS:
        raise ValueError(f"sts_output {sts_output!r} is not one of {list(STS_OUTPUTS)}")
    make, tasks = _PAIR_HEAD[name], PAIR_HEADS[name]
    if task not in tasks:
        raise ValueError(f"pair head {name!r} cannot serve task {task!r} (only {list(tasks)})")
    return make(hidden_size, dropout, sts_output if TASKS[task].head_output == "regression" else "linear")
