"""An encoder's pooled sentence vectors and a sentiment model's logits, in row order: both
score a table in the same pieces (``scoring_pieces``), so a head on the pooled vectors
gives the model's logits to the bit."""

from __future__ import annotations

import numpy as np
import torch

from minbert.data.batches import TokenizedTable, length_bucketed_batches, pad, split_by_tokens
from minbert.device import compute_context
from minbert.model.bert import BertModel
from minbert.model.heads import SentimentClassifier, pool, run_head
from minbert.progress import progress


def scoring_pieces(lengths: np.ndarray, batch_size: int, max_tokens: int) -> list[list[np.ndarray]]:
    """Rows of similar length a batch, each batch in pieces under the token budget."""
    batches = length_bucketed_batches(lengths, batch_size, shuffle=False)
    return [list(split_by_tokens(batch, lengths, max_tokens)) for batch in batches]


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
    batches = scoring_pieces(seqs.lengths(), batch_size, max_tokens)
    with progress() as bar:
        job = bar.add_task(f"encode {len(table)} rows", total=len(batches), status="")
        for pieces in batches:
            for rows in pieces:
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
    for rows in (
        piece
        for pieces in scoring_pieces(table.sequences["input_ids"].lengths(), batch_size, max_tokens)
        for piece in pieces
    ):
        ids, mask = pad(seqs, rows)
        with compute_context(device):
            logits = model(ids.to(device), mask.to(device))
        out[torch.from_numpy(rows)] = logits.float().cpu()
    return out


@torch.inference_mode()
def logits_from_pooled(
    model: SentimentClassifier,
    pooled: torch.Tensor,
    table: TokenizedTable,
    batch_size: int,
    device: torch.device,
    max_tokens: int = 0,
) -> torch.Tensor:
    """``predict_logits`` of a model whose encoder gave ``pooled`` (``encode_pooled``'s
    vectors of ``table``): its head on the same pieces, the same numbers."""
    model.eval()
    out = torch.empty(len(table), model.head.linear.out_features)
    for rows in (
        piece
        for pieces in scoring_pieces(table.sequences["input_ids"].lengths(), batch_size, max_tokens)
        for piece in pieces
    ):
        with compute_context(device):
            logits = run_head(model.head, pooled[torch.from_numpy(rows)].to(device))
        out[torch.from_numpy(rows)] = logits.float().cpu()
    return out
