"""The multitask model on its dev, slice or test tables: each task's loss and metric,
their average, and the predictions; sharded across data-parallel ranks."""

from __future__ import annotations

import numpy as np
import torch

from minbert.data.batches import length_bucketed_batches
from minbert.data.multitask import TaskData
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
) -> tuple[dict, dict[str, np.ndarray]]:
    """Each task's loss, metric and selection metric, their averages, and the predictions in
    row order (test tables: predictions only). Under torchrun each rank scores every
    ``world.size``-th batch and the outputs are gathered: every rank returns the same."""
    was_training = model.training
    model.eval()
    metrics, preds = {}, {}
    for task, d in data.items():
        batches = length_bucketed_batches(d.lengths, batch_size, shuffle=False)
        mine = []
        with progress(quiet=not show_progress) as bar:
            job = bar.add_task(f"{task}: {len(d)} examples", total=len(batches), status="")
            for rows in batches[world.rank :: world.size]:
                with compute_context(device):
                    batch = d.batch(rows, pad_multiple(device)).to(device)
                    mine.append((rows, model(task, batch).float().cpu()))
                bar.advance(job, world.size)
        parts = [part for rank_parts in world.all_gather(mine) for part in rank_parts]
        output = torch.empty(len(d), *parts[0][1].shape[1:])
        seen = np.zeros(len(d), dtype=int)
        for rows, out in parts:
            output[torch.from_numpy(rows)] = out
            seen[rows] += 1
        if not (seen == 1).all():
            raise RuntimeError(
                f"{task}: evaluation covered rows {np.flatnonzero(seen != 1)[:8]} "
                f"{sorted(set(seen[seen != 1]))} times, not once"
            )
        preds[task] = predictions(task, output)
        if d.table.labels is not None:
            labels = d.labels(np.arange(len(d)))
            metrics[f"loss_{task}"] = task_loss(task, output, labels).item()
            metrics[TASKS[task].metric_key] = score(task, labels.numpy(), preds[task])
            metrics[TASKS[task].selection_key] = selection_score(task, labels.numpy(), preds[task])
    if all(TASKS[t].metric_key in metrics for t in MULTITASK_TASKS):
        metrics[AVERAGE] = float(np.mean([metrics[TASKS[t].metric_key] for t in MULTITASK_TASKS]))
        metrics[SELECTION] = float(np.mean([metrics[TASKS[t].selection_key] for t in MULTITASK_TASKS]))
    model.train(was_training)
    return metrics, preds
