"""The multitask model on its dev, slice or test tables: each task's loss and metric,
their average, and the predictions; sharded across data-parallel ranks. A siamese head's
table is scored sentence by sentence: each distinct sentence encoded once, batched with
sentences of its own length, then the head reads the pairs' vectors."""

from __future__ import annotations

import numpy as np
import torch

from minbert.data.batches import Sequences, length_bucketed_batches, pad
from minbert.data.multitask import Batch, TaskData
from minbert.device import compute_context, pad_multiple
from minbert.distributed import World
from minbert.metrics import score, selection_score
from minbert.model.multitask import MultitaskBert, predictions, task_loss
from minbert.progress import progress
from minbert.tasks import AVERAGE, MULTITASK_TASKS, SELECTION, TASKS


@torch.inference_mode()
def evaluate_multitask(
    model: MultitaskBert,
    data: dict[str, TaskData],
    batch_size: int,
    device: torch.device,
    world: World = World(),
    show_progress: bool = False,
    vectors: dict[str, torch.Tensor] | None = None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Each task's loss, metric and selection metric, their averages, and the predictions in
    row order (test tables: predictions only). Under torchrun each rank scores every
    ``world.size``-th batch and the outputs are gathered: every rank returns the same.
    ``vectors``: per task, what its head reads for every row (the frozen checkpoint's, from
    the features stage), given for a model whose encoder is that checkpoint: its head reads
    them instead of encoding the rows again."""
    was_training = model.training
    model.eval()
    metrics, preds = {}, {}
    for task, d in data.items():
        if vectors is not None and task in vectors:
            output = head_output(model, task, vectors[task], device)
        else:
            output = task_output(model, task, d, batch_size, device, world, show_progress)
        preds[task] = predictions(task, output)
        if d.table.labels is not None:
            labels = d.labels(np.arange(len(d)))
            metrics[TASKS[task].loss_key] = task_loss(task, output, labels).item()
            metrics[TASKS[task].metric_key] = score(task, labels.numpy(), preds[task])
            metrics[TASKS[task].selection_key] = selection_score(task, labels.numpy(), preds[task])
    if all(TASKS[t].metric_key in metrics for t in MULTITASK_TASKS):
        metrics[AVERAGE] = float(np.mean([metrics[TASKS[t].metric_key] for t in MULTITASK_TASKS]))
        metrics[SELECTION] = float(np.mean([metrics[TASKS[t].selection_key] for t in MULTITASK_TASKS]))
    model.train(was_training)
    return metrics, preds


def task_output(
    model: MultitaskBert,
    task: str,
    d: TaskData,
    batch_size: int,
    device: torch.device,
    world: World = World(),
    show_progress: bool = False,
) -> torch.Tensor:
    """The head's output for every row of ``d`` (float32, on the host, in row order)."""
    if not d.siamese:
        return _gathered(
            d.lengths, batch_size, device, world, show_progress, f"{task}: {len(d)} examples",
            lambda rows: model(task, d.batch(rows, pad_multiple(device)).to(device)),
        )  # fmt: skip
    # Each distinct sentence encoded once, in batches of similar own lengths; the head then
    # reads the pairs' vectors.
    sentences, first, second = distinct_sentences(d)
    vectors = _gathered(
        sentences.lengths(), batch_size, device, world, show_progress, f"{task}: {len(d)} pairs",
        lambda rows: model.pooled(_sentence_batch(sentences, rows, device)),
    )  # fmt: skip
    return head_output(model, task, torch.stack([vectors[first], vectors[second]], dim=1), device)


def head_output(model: MultitaskBert, task: str, vectors: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The head's output for pooled ``vectors`` in row order: ``(rows, hidden)``, or
    ``(rows, 2, hidden)`` for a siamese head (float32, on the host)."""
    if vectors.dim() == 3:  # the stacked layout of MultitaskBert.pooled: first sentences, then second
        vectors = torch.cat([vectors[:, 0], vectors[:, 1]])
    with compute_context(device):
        return model.head_output(task, vectors.to(device)).float().cpu()


def distinct_sentences(d: TaskData) -> tuple[Sequences, np.ndarray, np.ndarray]:
    """A siamese table's distinct sentences (by their token ids), and for each pair the
    index of its first and of its second sentence among them."""
    seqs = d.table.sequences
    index: dict[bytes, int] = {}
    kept: list[np.ndarray] = []
    where = {}
    for column in ("input_ids_1", "input_ids_2"):
        found = np.empty(len(d), dtype=np.int64)
        for i in range(len(d)):
            ids = seqs[column][i]
            key = np.asarray(ids, dtype=np.int64).tobytes()
            if key not in index:
                index[key] = len(kept)
                kept.append(ids)
            found[i] = index[key]
        where[column] = found
    return Sequences.from_list(kept), where["input_ids_1"], where["input_ids_2"]


def _sentence_batch(sentences: Sequences, rows: np.ndarray, device: torch.device) -> Batch:
    ids, mask = pad(sentences, rows, multiple=pad_multiple(device))
    return Batch(ids, mask, None, rows, padded=not bool(mask.all())).to(device)


def _gathered(lengths, batch_size, device, world, show_progress, title, forward) -> torch.Tensor:
    """``forward(rows)`` of every row, in batches of similar length (each rank every
    ``world.size``-th), gathered in row order (float32, on the host)."""
    batches = length_bucketed_batches(lengths, batch_size, shuffle=False)
    mine = []
    with progress(quiet=not show_progress) as bar:
        job = bar.add_task(title, total=len(batches), status="")
        for rows in batches[world.rank :: world.size]:
            with compute_context(device):
                mine.append((rows, forward(rows).float().cpu()))
            bar.advance(job, world.size)
    parts = [part for rank_parts in world.all_gather(mine) for part in rank_parts]
    output = torch.empty(len(lengths), *parts[0][1].shape[1:])
    seen = np.zeros(len(lengths), dtype=int)
    for rows, out in parts:
        output[torch.from_numpy(rows)] = out
        seen[rows] += 1
    if not (seen == 1).all():
        raise RuntimeError(
            f"{title}: evaluation covered rows {np.flatnonzero(seen != 1)[:8]} "
            f"{sorted(set(seen[seen != 1]))} times, not once"
        )
    return output
