"""Fitting the task heads on the frozen checkpoint before fine-tuning starts.

Fresh heads are random projections: at a small budget the first steps of fine-tuning
bend the encoder towards them instead of training the heads (at the cpu scale a head
gets 72 updates). Fitting each head first on the pooled vectors of the untouched
checkpoint ("linear probing, then fine-tuning", Kumar et al., 2022, who show it also
distorts the pretrained features less) starts fine-tuning from heads that already
read the features.

The encoder runs once over each task's training and validation rows (eval mode, no
gradient); the heads then train on those cached vectors alone, which costs next to
nothing: up to ``epochs`` passes of AdamW at ``lr`` (weight decay on the weight
matrices only), keeping the pass with the lowest validation loss (per task). The
heads train in training mode (their own dropout on the features), the validation
loss is taken in eval mode. Heads without parameters (the cosine head) are left as
they are. Every draw is seeded, and the global random state is restored afterwards,
so each data-parallel rank fits the same heads and training then runs as it would
have without the warm-up.
"""

from __future__ import annotations

import numpy as np
import torch

from minbert.data.batches import length_bucketed_batches, random_batches
from minbert.data.multitask import TaskData
from minbert.device import compute_context, pad_multiple, to_device
from minbert.metrics import fixed
from minbert.model.multitask import MultitaskBert, task_loss
from minbert.settings import HeadWarmup


@torch.no_grad()  # not inference_mode: the heads' backward pass saves these
def pooled_vectors(
    model: MultitaskBert, task: str, data: TaskData, batch_size: int, device: torch.device
) -> torch.Tensor:
    """The pooled vectors of every row of ``data``, in eval mode: ``(rows, hidden)``, or
    ``(rows, 2, hidden)`` for a siamese head (the pair's two sentences)."""
    was_training = model.training
    model.eval()
    parts, order = [], []
    for rows in length_bucketed_batches(data.lengths, batch_size, shuffle=False):
        with compute_context(device):
            pooled = model.pooled(data.batch(rows, pad_multiple(device)).to(device)).float()
        parts.append(torch.stack(pooled.chunk(2), dim=1) if model.is_siamese(task) else pooled)
        order.append(rows)
    model.train(was_training)
    vectors = torch.empty(len(data), *parts[0].shape[1:], device=parts[0].device)
    vectors[torch.from_numpy(np.concatenate(order)).to(vectors.device)] = torch.cat(parts)
    return vectors


def _head_loss(model: MultitaskBert, task: str, vectors: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if model.is_siamese(task):  # back to the stacked layout of MultitaskBert.pooled
        vectors = torch.cat([vectors[:, 0], vectors[:, 1]])
    return task_loss(task, model.head_output(task, vectors), labels)


def _validation_loss(model: MultitaskBert, task: str, vectors: torch.Tensor, labels: torch.Tensor) -> float:
    head = model.heads[task]
    head.eval()
    with torch.no_grad():
        loss = _head_loss(model, task, vectors, labels).item()
    head.train()
    return loss


def warm_up_heads(
    model: MultitaskBert,
    train: dict[str, TaskData],
    validation: dict[str, TaskData],
    warmup: HeadWarmup,
    batch_size: dict[str, int],
    eval_batch_size: int,
    weight_decay: float,
    device: torch.device,
    seed: int,
) -> dict[str, dict]:
    """Fit each task head of ``model`` on the frozen encoder's pooled vectors; returns,
    per task with a trainable head, the pass kept (0: none beat the fresh head) and the
    validation loss before and after."""
    if warmup.epochs == 0:
        return {}
    rng = np.random.default_rng(seed)
    report = {}
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for task, data in train.items():
            if task not in warmup.tasks:
                continue
            head = model.heads[task]
            params = [p for p in head.parameters() if p.requires_grad]
            if not params:
                continue
            x = pooled_vectors(model, task, data, eval_batch_size, device)
            y = to_device(data.labels(np.arange(len(data))), device)
            val_x = pooled_vectors(model, task, validation[task], eval_batch_size, device)
            val_y = to_device(validation[task].labels(np.arange(len(validation[task]))), device)
            optimizer = torch.optim.AdamW(
                [
                    {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                    {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
                ],
                lr=warmup.lr,
            )

            before = best_loss = _validation_loss(model, task, val_x, val_y)
            best_epoch, best_state = 0, {k: v.clone() for k, v in head.state_dict().items()}
            head.train()
            for epoch in range(1, warmup.epochs + 1):
                for rows in random_batches(len(data), batch_size[task], rng):
                    index = torch.from_numpy(rows).to(device)
                    optimizer.zero_grad(set_to_none=True)
                    _head_loss(model, task, x[index], y[index]).backward()
                    optimizer.step()
                loss = _validation_loss(model, task, val_x, val_y)
                if loss < best_loss:
                    best_epoch, best_loss = epoch, loss
                    best_state = {k: v.clone() for k, v in head.state_dict().items()}
            head.load_state_dict(best_state)
            report[task] = {
                "epochs_kept": best_epoch,
                "validation_loss_before": fixed(before),
                "validation_loss_after": fixed(best_loss),
            }
    model.zero_grad(set_to_none=True)
    return report
