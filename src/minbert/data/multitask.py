"""The multitask tables as padded batches (siamese: first sentences, then second; the
cross-encoder: the packed pair with segment ids), and an epoch's order of them: every
task gets as many batches as the task with the most needs, a smaller one starting a fresh
shuffled pass when it runs out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minbert.data.batches import TokenizedTable, length_bucketed_batches, pad
from minbert.device import to_device
from minbert.tasks import TASKS


@dataclass
class Batch:
    """Padded tensors of one task's batch. Siamese pairs stack both sentences:
    rows [0, n) are the first sentences, rows [n, 2n) the second."""

    ids: torch.Tensor
    mask: torch.Tensor
    token_types: torch.Tensor | None
    rows: np.ndarray  # table rows of the examples, for labels and error messages
    padded: bool = True  # whether any position is padding (known on the host)

    def to(self, device: torch.device) -> Batch:
        types = None if self.token_types is None else to_device(self.token_types, device)
        return Batch(to_device(self.ids, device), to_device(self.mask, device), types, self.rows, self.padded)


class TaskData:
    """One task's tokenised split, turned into batches for a given head family."""

    def __init__(self, task: str, table: TokenizedTable, siamese: bool):
        self.task, self.table, self.siamese = task, table, siamese
        seqs = table.sequences
        if not TASKS[task].is_pair:
            self.lengths = seqs["input_ids"].lengths()
        elif siamese:
            self.lengths = np.maximum(seqs["input_ids_1"].lengths(), seqs["input_ids_2"].lengths())
        else:
            self.lengths = seqs["pair_input_ids"].lengths()

    def __len__(self) -> int:
        return len(self.table)

    def batch(self, rows: np.ndarray, multiple: int = 1) -> Batch:
        """The padded batch of ``rows``, its width a multiple of ``multiple``."""
        seqs = self.table.sequences
        types = None
        if not TASKS[self.task].is_pair:
            ids, mask = pad(seqs["input_ids"], rows, multiple=multiple)
        elif self.siamese:
            # Both sentences in one padded batch: one encoder pass serves the pair.
            both = type(seqs["input_ids_1"]).from_list(
                [seqs["input_ids_1"][i] for i in rows] + [seqs["input_ids_2"][i] for i in rows]
            )
            ids, mask = pad(both, np.arange(2 * len(rows)), multiple=multiple)
        else:
            ids, mask = pad(seqs["pair_input_ids"], rows, multiple=multiple)
            types, _ = pad(seqs["pair_token_type_ids"], rows, multiple=multiple)
        return Batch(ids, mask, types, rows, padded=not bool(mask.all()))

    def labels(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(self.table.labels[rows]))


def task_batches(
    lengths: dict[str, np.ndarray], batch_size: dict[str, int], rng: np.random.Generator
) -> dict[str, list[np.ndarray]]:
    """Each task's batches (row indices) for one epoch, the same number for every task;
    every example is seen at least once."""

    def new_pass(task):
        return length_bucketed_batches(lengths[task], batch_size[task], shuffle=True, generator=rng)

    passes = {task: new_pass(task) for task in lengths}
    n = max(len(p) for p in passes.values())
    out: dict[str, list[np.ndarray]] = {task: [] for task in lengths}
    for _ in range(n):
        for task in lengths:
            if not passes[task]:
                passes[task] = new_pass(task)
            out[task].append(passes[task].pop(0))
    return out


def epoch_steps(
    lengths: dict[str, np.ndarray],
    batch_size: dict[str, int],
    rng: np.random.Generator,
    *,
    one_task_per_step: bool,
) -> list[dict[str, np.ndarray]]:
    """One epoch's steps, each mapping its tasks to their rows: one task per step in turn
    (``one_task_per_step``, round-robin: 3n steps), or one batch of every task (n steps)."""
    batches = task_batches(lengths, batch_size, rng)
    n = len(next(iter(batches.values())))
    if one_task_per_step:
        return [{task: batches[task][i]} for i in range(n) for task in batches]
    return [{task: batches[task][i] for task in batches} for i in range(n)]
