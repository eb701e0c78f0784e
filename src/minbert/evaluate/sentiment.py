"""An encoder's pooled sentence vectors and a sentiment model's logits, in row order."""

from __future__ import annotations

import torch

from minbert.data.batches import TokenizedTable, length_bucketed_batches, pad, split_by_tokens
from minbert.device import compute_context
from minbert.model.bert import BertModel
from minbert.model.heads import SentimentClassifier, pool
from minbert.progress import progress


@torch.inference_mode()
def encode_pooled(
    encoder: BertModel,
    table: TokenizedTable,
    batch_size: int,
    device: torch.device,
    max_tokens: int = 0,
    pooling: str = "pooler",
    column: str = "input_ids",
) -> torch.Tensor:
    """The pooled vector of every row's ``column`` sequence, in row order (encoder in
    eval mode)."""
    was_training = encoder.training
    encoder.eval()
    seqs = table.sequences[column]
    out = torch.empty(len(table), encoder.config.hidden_size)
    batches = length_bucketed_batches(seqs.lengths(), batch_size, shuffle=False)
    with progress() as bar:
        job = bar.add_task(f"encode {len(table)} rows", total=len(batches), status="")
        for batch in batches:
            for rows in split_by_tokens(batch, seqs.lengths(), max_tokens):
                ids, mask = pad(seqs, rows)
                with compute_context(device):
                    mask = mask.to(device)
                    pooled = pool(encoder(ids.to(device), mask), mask, pooling)
                out[torch.from_numpy(rows)] = pooled.float().cpu()
            bar.advance(job)
    encoder.train(was_training)
    return out


@torch.inference_mode()
def predict_logits(
    model: SentimentClassifier,
    table: TokenizedTable,
    batch_size: int,
    device: torch.device,
    max_tokens: int = 0,
) -> torch.Tensor:
    model.eval()
    seqs = table.sequences["input_ids"]
    out = torch.empty(len(table), model.head.linear.out_features)
    batches = length_bucketed_batches(seqs.lengths(), batch_size, shuffle=False)
    for rows in (piece for b in batches for piece in split_by_tokens(b, seqs.lengths(), max_tokens)):
        ids, mask = pad(seqs, rows)
        with compute_context(device):
            logits = model(ids.to(device), mask.to(device))
        out[torch.from_numpy(rows)] = logits.float().cpu()
    return out
