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


def steps_per_epoch(batches: int, tasks: int, *, one_task_per_step: bool, batches_per_step: int = 1) -> int:
    """``epoch_steps``' count: ceil(tasks x batches / k) round-robin, ceil(batches / k) else."""
    return -(-(tasks if one_task_per_step else 1) * batches // batches_per_step)


def epoch_steps(
    lengths: dict[str, np.ndarray],
    batch_size: dict[str, int],
    rng: np.random.Generator,
    *,
    one_task_per_step: bool,
    batches_per_step: int = 1,
) -> list[dict[str, np.ndarray]]:
    """One epoch's steps, each mapping its tasks to their rows: one task per step in turn
    (``one_task_per_step``, round-robin: 3n steps), or one batch of every task (n steps).
    With ``batches_per_step`` k, a step takes about k of its task's batches, the same rows in the
    same order, so round-robin at k = 3 makes the joint modes' steps on their examples."""
    batches = task_batches(lengths, batch_size, rng)
    tasks = list(batches)
    n = len(batches[tasks[0]])
    k = batches_per_step
    total = steps_per_epoch(n, len(tasks), one_task_per_step=one_task_per_step, batches_per_step=k)
    # Round-robin's step s is task s mod 3's; the joint modes' every task's.
    slots = {t: len(range(i, total, len(tasks))) if one_task_per_step else total for i, t in enumerate(tasks)}
    if min(slots.values()) < 1:
        raise ValueError(f"batches_per_step {k} leaves a task no step: each has {n} batches an epoch")
    grouped = {t: _grouped(batches[t], slots[t], lengths[t]) for t in tasks}
    if one_task_per_step:
        return [{t: grouped[t][i]} for i in range(max(slots.values())) for t in tasks if i < slots[t]]
    return [{t: grouped[t][i] for t in tasks} for i in range(total)]


def _grouped(batches: list[np.ndarray], steps: int, lengths: np.ndarray) -> list[np.ndarray]:
    # Consecutive batches, as evenly as can be; rows by length, for split_by_tokens' pieces.
    if steps == len(batches):
        return batches
    groups = np.array_split(np.arange(len(batches)), steps)
    merged = [np.concatenate([batches[i] for i in group]) for group in groups]
    return [rows[np.argsort(lengths[rows], kind="stable")] for rows in merged]
