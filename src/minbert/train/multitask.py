"""Multitask fine-tuning: one shared encoder, three tasks.

Tasks: SST 5-class sentiment (cross-entropy), Quora paraphrase (binary
cross-entropy on a logit), STS similarity (MSE on the 0-5 scale).

How the tasks share the optimizer steps (``gradient``):

* ``round-robin`` (the paper's, its Section 3): each step trains on one task's
  mini-batch, cycling SST, Quora, STS, so that every task gets the same number of
  batches per epoch;
* ``summed``: each step takes one batch of every task and back-propagates the sum
  of the three losses;
* ``pcgrad``: each step takes one batch of every task and combines the task
  gradients of the shared encoder by PCGrad gradient surgery.

Either way an epoch gives every task as many batches as the task with the most
batches needs; a smaller task that runs out starts a fresh pass with a new shuffle
rather than replaying a cached order. SMART adds an adversarial smoothness term
and a Bregman proximal term against a momentum teacher to each task's loss; the
history logs the task losses and the two SMART terms apart.

Each run is scored before its first update (epoch 0) and after every epoch on
fixed slices of the dev and training sets (the history); the best epoch by the
dev slice's average is then scored on the full dev sets, which give the reported
numbers, and predicts the test sets.

Under ``torchrun`` the same loop runs data-parallel (``DistributedDataParallel``);
``minbert.train.distributed`` says how the batches, losses and outputs are split.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from minbert.atomic import atomic_write_text
from minbert.data.batches import TokenizedTable, length_bucketed_batches, pad
from minbert.evaluate import write_predictions
from minbert.metrics import AVERAGE, METRIC, as_written, fixed, history_csv, score
from minbert.metrics import MULTITASK_TASKS as TASKS
from minbert.model.bert import BertModel
from minbert.model.heads import POOLINGS, STS_OUTPUTS, ClassificationHead, build_pair_head, pool
from minbert.progress import progress
from minbert.train.device import compute_context, pad_multiple, to_device
from minbert.train.distributed import World
from minbert.train.optim import build_optimizer, build_scheduler
from minbert.train.pcgrad import pcgrad_backward
from minbert.train.resume import DEFAULT_DIRECTORY as RESUME_DIRECTORY
from minbert.train.resume import (
    ResumePoint,
    fingerprint,
    generator_states,
    restore_generators,
)
from minbert.train.sentiment import NonFiniteLoss, subsample
from minbert.train.smart import EmaTeacher, SmartSettings, bregman_loss, smoothness_loss

GRADIENT_MODES = ("round-robin", "summed", "pcgrad")
# How SMART compares two outputs of each task.
DIVERGENCE = {"sst": "multiclass", "quora": "binary", "sts": "regression"}
# What each training step logs per task: the task's own loss, then SMART's two
# terms (unweighted; zero without SMART).
LOSS_PARTS = ("loss", "adversarial", "bregman")


@dataclass(frozen=True)
class MultitaskSettings:
    paraphrase_head: str
    sts_head: str
    gradient: str
    optimizer: str
    lr: float
    weight_decay: float
    lr_schedule: str
    lr_gamma: float
    epochs: int
    batch_size: dict[str, int]
    train_examples: dict[str, int]  # 0: the whole split
    history_examples: dict[str, int]  # per task of the dev / train slices scored each epoch; 0: all
    eval_batch_size: int
    dropout: float
    grad_clip: float
    seed: int
    smart: SmartSettings | None = None
    compile: bool = False  # torch.compile the encoder's layers (pays off on a GPU)
    pooling: str = "pooler"  # a name of minbert.model.heads.POOLINGS
    sts_output: str = "sigmoid"  # a name of minbert.model.heads.STS_OUTPUTS
    test_predictions: bool = True  # predict the test sets with the chosen epoch

    def __post_init__(self) -> None:
        if self.gradient not in GRADIENT_MODES:
            raise ValueError(f"gradient {self.gradient!r} is not one of {list(GRADIENT_MODES)}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {sorted(POOLINGS)}")
        if self.sts_output not in STS_OUTPUTS:
            raise ValueError(f"sts_output {self.sts_output!r} is not one of {list(STS_OUTPUTS)}")
        for name in ("batch_size", "train_examples"):
            if set(getattr(self, name)) != set(TASKS):
                raise ValueError(f"{name} must give a value for each of {list(TASKS)}")
        if set(self.history_examples) != {"dev", "train"}:
            raise ValueError("history_examples must give a size for `dev` and for `train`")
        if self.epochs < 1 or min(self.batch_size.values()) < 1:
            raise ValueError("epochs and batch sizes must be at least 1")


# ----------------------------------------------------------------------------- model


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
        return Batch(to_device(self.ids, device), to_device(self.mask, device), types, self.rows,
                     self.padded)


class MultitaskBert(nn.Module):
    def __init__(self, encoder: BertModel, paraphrase_head: str, sts_head: str, dropout: float,
                 pooling: str = "pooler", sts_output: str = "sigmoid"):
        super().__init__()
        h = encoder.config.hidden_size
        self.encoder = encoder
        self.pooling = pooling
        # Heads that do not read BERT's pooler leave it out of training altogether
        # (data-parallel training expects a gradient for every trainable weight).
        encoder.pooler.requires_grad_(pooling == "pooler")
        self.heads = nn.ModuleDict({
            "sst": ClassificationHead(h, 5, dropout),
            "quora": build_pair_head(paraphrase_head, "quora", h, dropout),
            "sts": build_pair_head(sts_head, "sts", h, dropout, sts_output),
        })

    def is_siamese(self, task: str) -> bool:
        return task != "sst" and self.heads[task].siamese

    def embed(self, batch: Batch) -> torch.Tensor:
        return self.encoder.embed(batch.ids, batch.token_types)

    def from_embedded(self, task: str, batch: Batch, embedded: torch.Tensor) -> torch.Tensor:
        """Task output from an embedding output (SMART perturbs the latter)."""
        attention = batch.mask if batch.padded else None  # no mask: SDPA's fastest kernel
        pooled = pool(self.encoder.encode(embedded, attention), batch.mask, self.pooling)
        if self.is_siamese(task):
            u, v = pooled.chunk(2)
            return self.heads[task](u, v)
        return self.heads[task](pooled)

    def forward(self, task: str, batch: Batch, embedded: torch.Tensor | None = None) -> torch.Tensor:
        # One entry point for every training pass (SMART's perturbed ones included),
        # so that under DistributedDataParallel each goes through its forward.
        return self.from_embedded(task, batch, self.embed(batch) if embedded is None else embedded)


def task_loss(task: str, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    output = output.float()
    if task == "sst":
        return F.cross_entropy(output, labels.long())
    if task == "quora":
        return F.binary_cross_entropy_with_logits(output, labels.float())
    return F.mse_loss(output, labels.float())


def predictions(task: str, output: torch.Tensor) -> np.ndarray:
    """Class ids, or STS scores at the precision prediction files hold them."""
    if task == "sst":
        return output.argmax(-1).numpy()
    if task == "quora":
        return (output > 0).long().numpy()
    return as_written(task, output.numpy())


# ----------------------------------------------------------------------------- data


class TaskData:
    """One task's tokenised split, turned into batches for a given head family."""

    def __init__(self, task: str, table: TokenizedTable, siamese: bool):
        self.task, self.table, self.siamese = task, table, siamese
        seqs = table.sequences
        if task == "sst":
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
        if self.task == "sst":
            ids, mask = pad(seqs["input_ids"], rows, multiple=multiple)
        elif self.siamese:
            # Both sentences in one padded batch: one encoder pass serves the pair.
            both = type(seqs["input_ids_1"]).from_list(
                [seqs["input_ids_1"][i] for i in rows] + [seqs["input_ids_2"][i] for i in rows])
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
    """Each task's batches (row indices) for one epoch, the same number for every task.

    The number is what the task with the most batches needs; the others start
    another freshly shuffled pass whenever they run out, so every example of every
    task is seen at least once per epoch.
    """
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
    gradient: str, lengths: dict[str, np.ndarray], batch_size: dict[str, int],
    rng: np.random.Generator,
) -> list[dict[str, np.ndarray]]:
    """One epoch of optimizer steps, each mapping the tasks it trains on to their rows.

    ``round-robin``: one task per step, cycling through the tasks in order, so n
    batches per task make 3n steps. ``summed`` and ``pcgrad``: one batch of every
    task per step, n steps.
    """
    if gradient not in GRADIENT_MODES:
        raise ValueError(f"gradient {gradient!r} is not one of {list(GRADIENT_MODES)}")
    batches = task_batches(lengths, batch_size, rng)
    n = len(next(iter(batches.values())))
    if gradient == "round-robin":
        return [{task: batches[task][i]} for i in range(n) for task in batches]
    return [{task: batches[task][i] for task in batches} for i in range(n)]


# ----------------------------------------------------------------------------- training


@dataclass
class MultitaskResult:
    history: list[dict] = field(default_factory=list)
    conflicts: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    dev: dict = field(default_factory=dict)  # the best epoch's scores on the full dev sets
    dev_predictions: dict[str, np.ndarray] = field(default_factory=dict)
    test_predictions: dict[str, np.ndarray] = field(default_factory=dict)
    train_examples: dict[str, int] = field(default_factory=dict)
    history_examples: dict[str, dict[str, int]] = field(default_factory=dict)
    dev_ids: dict[str, list[str]] = field(default_factory=dict)
    test_ids: dict[str, list[str]] = field(default_factory=dict)


@torch.inference_mode()
def evaluate(model: MultitaskBert, data: dict[str, TaskData], batch_size: int,
             device: torch.device, world: World = World()) -> tuple[dict, dict[str, np.ndarray]]:
    """Each task's loss (``loss_<task>``) and metric, the average of the metrics, and the
    predictions in row order. Unlabelled tables (test sets) give predictions only.

    Under torchrun each rank runs every ``world.size``-th batch and the outputs are
    gathered, so every rank returns the same numbers for every row, each row
    computed exactly once.
    """
    was_training = model.training
    model.eval()
    metrics, preds = {}, {}
    for task, d in data.items():
        batches = length_bucketed_batches(d.lengths, batch_size, shuffle=False)
        mine = []
        for rows in batches[world.rank::world.size]:
            with compute_context(device):
                batch = d.batch(rows, pad_multiple(device)).to(device)
                mine.append((rows, model(task, batch).float().cpu()))
        parts = [part for rank_parts in world.all_gather(mine) for part in rank_parts]
        output = torch.empty(len(d), *parts[0][1].shape[1:])
        seen = np.zeros(len(d), dtype=int)
        for rows, out in parts:
            output[torch.from_numpy(rows)] = out
            seen[rows] += 1
        if not (seen == 1).all():
            raise RuntimeError(f"{task}: evaluation covered rows {np.flatnonzero(seen != 1)[:8]} "
                               f"{sorted(set(seen[seen != 1]))} times, not once")
        preds[task] = predictions(task, output)
        if d.table.labels is not None:
            labels = d.labels(np.arange(len(d)))
            metrics[f"loss_{task}"] = task_loss(task, output, labels).item()
            metrics[METRIC[task]] = score(task, labels.numpy(), preds[task])
    if all(METRIC[t] in metrics for t in TASKS):
        metrics[AVERAGE] = float(np.mean([metrics[METRIC[t]] for t in TASKS]))
    model.train(was_training)
    return metrics, preds


class LossWatch:
    """Each step's losses on the host, for the finiteness check and the log, without
    making the host wait for the device every step.

    On a GPU each step's losses are copied to the host asynchronously and read one
    step later, when the device has long finished them, so the host keeps queueing
    work; a non-finite loss then stops training one step later, still naming the
    step and the examples it happened on. On the CPU they are read at once.
    """

    def __init__(self, world: World, train: dict[str, TaskData]):
        self.world, self.train = world, train
        self.pending = None  # (host copy, event or None, epoch, step, rows by task)
        self.last: torch.Tensor | None = None  # newest losses read: (task, LOSS_PARTS) global means

    def push(self, step_losses: torch.Tensor, local_losses: torch.Tensor, epoch: int, step: int,
             rows: dict[str, np.ndarray]) -> None:
        both = torch.stack([step_losses, local_losses]).detach()
        event = None
        if both.is_cuda:
            both = both.to("cpu", non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self.read()
        self.pending = (both, event, epoch, step, rows)
        if event is None:
            self.read()

    def read(self) -> None:
        """Check the pending step's losses (waiting for them if need be)."""
        if self.pending is None:
            return
        both, event, epoch, step, rows = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        if not bool(torch.isfinite(both[0]).all()):
            _raise_non_finite(self.world, epoch, step, both[1], rows, self.train)
        self.last = both[0]


class MultitaskStep:
    """One training step, as ``train_multitask`` runs it: the objective of each task
    the step trains on (its loss, plus SMART's terms when on) over this rank's share
    of the task's global batch, the backward pass (PCGrad's with ``pcgrad``), gradient
    clipping, the optimizer step and SMART's teacher update. The benchmarks in
    ``bench/`` time this same object.
    """

    def __init__(self, settings: MultitaskSettings, model: MultitaskBert,
                 train: dict[str, TaskData], device: torch.device, world: World = World()):
        self.settings, self.model, self.train, self.device, self.world = (
            settings, model, train, device, world)
        # Summed losses: DDP averages the gradients during the backward pass. PCGrad
        # takes per-task gradients with autograd.grad, which DDP does not see, so it
        # runs without DDP's synchronisation and averages each task's gradient itself.
        # Round-robin steps leave the other tasks' heads without a gradient, which DDP
        # must be told to expect.
        self.net = model
        if world.distributed:
            self.net = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=settings.gradient == "round-robin")
        self.no_sync = (self.net.no_sync if world.distributed and settings.gradient == "pcgrad"
                        else contextlib.nullcontext)
        # PCGrad operates on the shared encoder; each head keeps its own task's gradient.
        self.shared = [p for p in model.encoder.parameters() if p.requires_grad]
        self.heads = [list(model.heads[t].parameters()) for t in TASKS]
        self.optimizer = build_optimizer(settings.optimizer, model, lr=settings.lr,
                                         weight_decay=settings.weight_decay)
        self.teacher = EmaTeacher(model, settings.smart.beta) if settings.smart else None
        self.pcgrad_generator = torch.Generator().manual_seed(settings.seed)
        # SMART's random starts, drawn for whole global batches: alike on every rank.
        self.smart_generator = torch.Generator(device).manual_seed(settings.seed)
        self.watch = LossWatch(world, train)
        self.pad_multiple = pad_multiple(device)

    @property
    def generators(self) -> tuple[torch.Generator, torch.Generator]:
        return self.pcgrad_generator, self.smart_generator

    def __call__(self, rows_by_task: dict[str, np.ndarray], epoch: int = 0,
                 step: int = 0) -> tuple[torch.Tensor, dict | None]:
        """Train on one global batch of each task in ``rows_by_task`` (row indices into
        ``train``; one task per round-robin step, all three otherwise).

        Returns a (task, LOSS_PARTS) tensor on the device: each trained task's mean
        loss and SMART terms over its global batch (zeros for the other tasks) and,
        with PCGrad, the conflict statistics of the task gradients. A non-finite loss
        raises :class:`NonFiniteLoss` (on a GPU, during the next call or :meth:`flush`).
        """
        world, smart, stats = self.world, self.settings.smart, None
        objectives, rows_used = [], {}
        local = torch.zeros(len(TASKS), len(LOSS_PARTS), device=self.device)
        with self.no_sync():
            for k, task in enumerate(TASKS):
                if task not in rows_by_task:
                    continue
                rows = rows_by_task[task]
                positions = world.shard(len(rows))
                weight = world.loss_weight(len(positions), len(rows))
                # A rank left without rows of a small last batch runs one row with
                # weight zero: every rank joins every collective.
                if not len(positions):
                    positions = np.zeros(1, dtype=int)
                data = self.train[task]
                batch = data.batch(rows[positions], self.pad_multiple).to(self.device)
                labels = to_device(data.labels(batch.rows), self.device)
                start = None if smart is None else _smart_start(
                    data, rows, positions, batch, self.model.encoder.config.hidden_size,
                    smart.noise_std, self.smart_generator, self.pad_multiple)
                objective, parts = _task_objective(self.model, self.net, self.teacher, smart,
                                                   task, batch, labels, self.device, start)
                objectives.append(weight * objective)
                local[k] = weight * parts
                rows_used[task] = batch.rows
            step_losses = local.clone()
            if world.distributed:
                # The global batch's mean of each task's losses, for the log and the check.
                dist.all_reduce(step_losses)
                step_losses /= world.size
            self.watch.push(step_losses, local, epoch, step, rows_used)
            self.optimizer.zero_grad(set_to_none=True)
            if self.settings.gradient == "pcgrad":
                stats = pcgrad_backward(objectives, self.shared, self.heads,
                                        generator=self.pcgrad_generator,
                                        reduce=world.all_reduce_mean_)
            else:
                torch.stack(objectives).sum().backward()
        if self.settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.optimizer.step()
        if self.teacher is not None:
            self.teacher.update(self.model)
        return step_losses, stats

    def flush(self) -> None:
        """Check the last step's losses (at the end of an epoch)."""
        self.watch.read()


def history_row(epoch: int, lr: float | None, train_losses: dict[str, float],
                dev: dict, train: dict) -> dict:
    """One line of the history file: the epoch's mean training losses (none at epoch
    0), then the dev slice's and the training slice's losses and metrics."""
    row = {"epoch": epoch, "lr": lr, **train_losses}
    row.update({f"dev_{k}": fixed(v) for k, v in dev.items()})
    row.update({f"train_{k}": fixed(v) for k, v in train.items() if not k.startswith("loss_")})
    return row


def train_multitask(
    settings: MultitaskSettings,
    encoder: BertModel,
    tables: dict[tuple[str, str], TokenizedTable],
    device: torch.device,
    compile_options: dict | None = None,
    resume: ResumePoint | None = None,
    world: World = World(),
) -> MultitaskResult:
    """Train on ``tables[(task, "train")]``; score fixed slices of the dev and training
    sets before training and after every epoch; select the best epoch (1 or later)
    by the dev slice's average and score it on the full ``(task, "dev")`` tables;
    predict ``(task, "test")`` where given.

    With several ranks (``world``), each step's global batch of a task holds
    ``world.size * batch_size`` rows, split across the ranks.
    """
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    model = MultitaskBert(encoder, settings.paraphrase_head, settings.sts_head,
                          settings.dropout, settings.pooling, settings.sts_output).to(device)
    # Built alike on every rank; from here on each rank draws its own dropout masks.
    torch.manual_seed(settings.seed + world.rank)
    if settings.compile:
        model.encoder.compile_layers(**(compile_options or {}))

    def data(task: str, table: TokenizedTable, limit: int = 0, seed: int = settings.seed) -> TaskData:
        return TaskData(task, subsample(table, limit, seed), model.is_siamese(task))

    train = {t: data(t, tables[t, "train"], settings.train_examples[t]) for t in TASKS}
    dev = {t: data(t, tables[t, "dev"]) for t in TASKS}
    test = {t: data(t, tables[t, "test"]) for t in TASKS
            if settings.test_predictions and (t, "test") in tables}
    # The history's fixed slices: of the dev sets, and of the training examples in use.
    sizes = settings.history_examples
    slices = {"dev": {t: data(t, dev[t].table, sizes["dev"]) for t in TASKS},
              "train": {t: data(t, train[t].table, sizes["train"], settings.seed + 1) for t in TASKS}}

    def score_slices() -> tuple[dict, dict]:
        return tuple(evaluate(model, slices[s], settings.eval_batch_size, device, world)[0]
                     for s in ("dev", "train"))

    train_step = MultitaskStep(settings, model, train, device, world)
    optimizer, teacher = train_step.optimizer, train_step.teacher
    scheduler = build_scheduler(settings.lr_schedule, optimizer, gamma=settings.lr_gamma)

    result = MultitaskResult()
    best_state, best_average = None, None
    lengths = {t: d.lengths for t, d in train.items()}
    global_batch = {t: settings.batch_size[t] * world.size for t in TASKS}
    batches_per_task = max(-(-len(d) // global_batch[t]) for t, d in train.items())
    steps_per_epoch = batches_per_task * (len(TASKS) if settings.gradient == "round-robin" else 1)
    global_step = 0
    first_epoch = 1
    # Rank 0 reads the saved state and hands it to the others: on several machines
    # only its disk is sure to have it.
    saved = world.broadcast(resume.load() if resume and world.is_main else None)
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        if teacher is not None:
            teacher.module.load_state_dict(saved["teacher"])
        restore_generators(saved["generators"][world.rank], rng, *train_step.generators)
        result.history, result.conflicts = saved["history"], saved["conflicts"]
        result.best_epoch, best_average = saved["best_epoch"], saved["best_average"]
        best_state, global_step = saved["best_state"], saved["global_step"]
        first_epoch = saved["epoch"] + 1
    else:
        # Epoch 0: the checkpoint with freshly initialised heads, before any update.
        result.history.append(history_row(0, None, {}, *score_slices()))
    with progress(quiet=not world.is_main) as bar:
        job = bar.add_task("multitask", total=settings.epochs * steps_per_epoch, status="",
                           completed=(first_epoch - 1) * steps_per_epoch)
        if saved is not None:
            bar.console.log(f"resumed from {resume.path} after epoch {first_epoch - 1}")
        for epoch in range(first_epoch, settings.epochs + 1):
            model.train()
            lr = optimizer.param_groups[0]["lr"]
            # Loss sums stay on the device (no host synchronisation for the log).
            sums = torch.zeros(len(TASKS), len(LOSS_PARTS), device=device)
            counts = np.zeros(len(TASKS))
            steps = epoch_steps(settings.gradient, lengths, global_batch, rng)
            for step, rows_by_task in enumerate(steps):
                step_losses, stats = train_step(rows_by_task, epoch, step)
                sums += step_losses
                counts += [t in rows_by_task for t in TASKS]
                if stats is not None:
                    result.conflicts.append(_conflict_row(epoch, global_step, stats))
                global_step += 1
                last = train_step.watch.last
                bar.update(job, advance=1, status=f"epoch {epoch} loss "
                           f"{'…' if last is None else f'{last[:, 0].sum():.3f}'}")
            train_step.flush()
            scheduler.step()
            means = (sums.cpu().numpy() / counts[:, None]).tolist()
            losses = {f"train_{part}_{t}": fixed(means[k][j]) for k, t in enumerate(TASKS)
                      for j, part in enumerate(LOSS_PARTS) if settings.smart or part == "loss"}
            dev_scores, train_scores = score_slices()
            result.history.append(history_row(epoch, lr, losses, dev_scores, train_scores))
            bar.console.log(f"epoch {epoch}: dev slice " + ", ".join(
                f"{k} {dev_scores[k]:.3f}" for k in (*(METRIC[t] for t in TASKS), AVERAGE)))
            # Strictly better only: ties keep the earlier (cheaper, less fitted) epoch.
            if best_state is None or dev_scores[AVERAGE] > best_average:
                result.best_epoch, best_average = epoch, dev_scores[AVERAGE]
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            # Collective: every rank's generators, each rank resumes from its own.
            generators = world.all_gather(generator_states(rng, *train_step.generators))
            if resume and world.is_main:
                resume.save({
                    "epoch": epoch, "global_step": global_step,
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "teacher": teacher.module.state_dict() if teacher is not None else None,
                    "generators": generators,
                    "history": result.history, "conflicts": result.conflicts,
                    "best_epoch": result.best_epoch, "best_average": best_average,
                    "best_state": best_state,
                })
    model.load_state_dict(best_state)
    result.dev, result.dev_predictions = evaluate(model, dev, settings.eval_batch_size, device, world)
    if test:
        _, result.test_predictions = evaluate(model, test, settings.eval_batch_size, device, world)
    result.train_examples = {t: len(d) for t, d in train.items()}
    result.history_examples = {s: {t: len(d) for t, d in sliced.items()} for s, sliced in slices.items()}
    result.dev_ids = {t: d.table.ids for t, d in dev.items()}
    result.test_ids = {t: d.table.ids for t, d in test.items()}
    return result


def _raise_non_finite(world: World, epoch: int, step: int, local_losses: torch.Tensor,
                      rows: dict[str, np.ndarray], train: dict[str, TaskData]) -> None:
    """Stop every rank with the step, the task and the example ids of the bad batch."""
    local = [f"task {task}; batch example ids: "
             f"{', '.join(train[task].table.ids[i] for i in rows[task])}"
             for task, parts in zip(TASKS, local_losses)
             if task in rows and not bool(torch.isfinite(parts).all())]
    found = [f"rank {rank}, {what}" if world.distributed else what
             for rank, found in enumerate(world.all_gather(local)) for what in found]
    raise NonFiniteLoss(f"non-finite loss at epoch {epoch}, step {step}, " + " | ".join(found))


def _smart_start(data: TaskData, rows: np.ndarray, positions: np.ndarray, batch: Batch,
                 hidden: int, std: float, generator: torch.Generator, multiple: int = 1) -> torch.Tensor:
    """SMART's random start for this rank's ``positions`` of a global batch of ``rows``.

    N(0, std^2) noise is drawn for the whole global batch (its rows, by its padded
    width) and this rank keeps its own rows and its own width: each example starts
    from the same noise however the batch is split across processes.
    """
    stacked = np.concatenate([positions, positions + len(rows)]) if data.siamese else positions
    width = -(-int(data.lengths[rows].max()) // multiple) * multiple
    shape = (len(rows) * (2 if data.siamese else 1), width, hidden)
    noise = torch.randn(shape, generator=generator, device=generator.device) * std
    return noise[torch.from_numpy(stacked).to(noise.device), : batch.ids.shape[1]]


def _task_objective(model, net, teacher, smart: SmartSettings | None, task, batch, labels, device,
                    start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's training objective and its LOSS_PARTS (detached, for the log): the
    task loss, plus SMART's weighted smoothness and Bregman terms when SMART is on.

    ``net`` is the model itself, or its DistributedDataParallel wrapper: every pass
    that builds the graph goes through it. ``start`` is SMART's random start.
    """
    with compute_context(device):
        embedded = model.embed(batch)
        output = net(task, batch, embedded)
    loss = task_loss(task, output, labels)
    if smart is None:
        zero = torch.zeros((), device=loss.device)
        return loss, torch.stack([loss.detach(), zero, zero])
    kind = DIVERGENCE[task]
    with compute_context(device):
        adversarial = smoothness_loss(lambda e: net(task, batch, e).float(),
                                      embedded, output.float(), kind, smart, start=start)
        with torch.no_grad():
            target = teacher.module(task, batch).float()
    bregman = bregman_loss(output.float(), target, kind)
    objective = loss + smart.lambda_s * adversarial + smart.mu * bregman
    return objective, torch.stack([loss, adversarial, bregman]).detach()


def _conflict_row(epoch: int, step: int, stats: dict) -> dict:
    cos = stats["cosines"]
    row = {"epoch": epoch, "step": step, "conflicts": stats["conflicts"], "pairs": stats["pairs"]}
    for i in range(len(TASKS)):
        for j in range(i + 1, len(TASKS)):
            row[f"cos_{TASKS[i]}_{TASKS[j]}"] = fixed(cos[i, j])
    return row


# ----------------------------------------------------------------------------- stage


def run_stage(params: dict, config: str, tokenized_dir: Path, manifest_file: Path,
              metrics_dir: Path, predictions_dir: Path, mlm_dir: Path | None = None,
              resume_dir: Path | None = RESUME_DIRECTORY) -> dict:
    """The multitask stage: train one configuration and write every output.

    With ``mlm_dir`` (an ``mlm@<start>`` stage's output) fine-tuning starts from
    that pretrained checkpoint instead of ``params["checkpoint"]``, and the outputs
    are named ``<start>-<config>``. Training state is saved to ``resume_dir`` after
    every epoch, and a rerun of an interrupted stage continues from it.
    """
    from minbert import params as params_module
    from minbert.train import distributed

    settings = params_module.multitask_settings(params, config)
    world, device = distributed.start(params["device"])
    try:
        return _run_stage(params, config, settings, world, device, tokenized_dir, manifest_file,
                          metrics_dir, predictions_dir, mlm_dir, resume_dir)
    finally:
        distributed.stop(world)


def _run_stage(params, config, settings, world, device, tokenized_dir, manifest_file, metrics_dir,
               predictions_dir, mlm_dir, resume_dir) -> dict:
    from minbert.model.checkpoint import describe_checkpoint, resolve_checkpoint
    from minbert.train.device import describe

    checkpoint_dir = resolve_checkpoint(params["checkpoint"]) if mlm_dir is None else Path(mlm_dir)
    name = config if mlm_dir is None else f"{Path(mlm_dir).name}-{config}"
    tables = {(t, s): TokenizedTable.read(tokenized_dir / f"{t}-{s}.parquet")
              for t in TASKS for s in ("train", "dev", "test")
              if (tokenized_dir / f"{t}-{s}.parquet").exists()}
    manifest = json.loads(Path(manifest_file).read_text(encoding="utf-8"))
    checkpoint = describe_checkpoint(
        params["checkpoint"] if mlm_dir is None
        else f"{params['checkpoint']} + MLM {Path(mlm_dir).name}", checkpoint_dir)
    resume = ResumePoint(resume_dir, f"multitask-{name}", fingerprint(
        settings=asdict(settings), checkpoint=checkpoint, device=device.type, processes=world.size,
        data={"-".join(k): len(v) for k, v in tables.items()}, manifest=manifest))
    result = train_multitask(settings, BertModel.from_pretrained(checkpoint_dir), tables, device,
                             resume=resume, world=world)

    metrics = {
        "config": config,
        # The best epoch on the full dev sets.
        **{METRIC[t]: fixed(result.dev[METRIC[t]]) for t in TASKS},
        AVERAGE: fixed(result.dev[AVERAGE]),
        "best_epoch": result.best_epoch,
        "epochs": settings.epochs,
        "selection": "the epoch (1 or later) with the best average on the dev slice",
        "train_examples": result.train_examples,
        "dev_examples": {t: len(ids) for t, ids in result.dev_ids.items()},
        # The fixed slices the history (and the choice of epoch) scores every epoch.
        "history_examples": result.history_examples,
        "data_split": {
            "sst": "course train / dev",
            "sts": "course train / dev",
            "quora": manifest["quora_split"],
        },
        "settings": {k: v for k, v in asdict(settings).items()
                     if k not in ("batch_size", "train_examples", "history_examples", "seed")},
        "batch_size": settings.batch_size,
        # Data-parallel processes; each step's batch of a task is processes x batch_size.
        "processes": world.size,
        "checkpoint": checkpoint,
        "pretraining": None if mlm_dir is None else {"start": Path(mlm_dir).name,
                                                     "directory": Path(mlm_dir).as_posix()},
        "scale": params["scale"],
        "seed": settings.seed,
        "device": describe(device) if world.size == 1 else f"{world.size} x {describe(device)}",
    }
    if not world.is_main:
        return metrics
    if result.conflicts:
        conflicts = pd.DataFrame(result.conflicts)
        metrics["pcgrad_conflict_fraction"] = fixed(conflicts.conflicts.sum() / conflicts.pairs.sum())
    for task in TASKS:
        write_predictions(predictions_dir / name / f"{task}-dev-out.csv", task,
                          result.dev_ids[task], result.dev_predictions[task])
        if task in result.test_predictions:
            write_predictions(predictions_dir / name / f"{task}-test-out.csv", task,
                              result.test_ids[task], result.test_predictions[task])
    atomic_write_text(metrics_dir / f"{name}-history.csv", history_csv(result.history))
    # Written for every configuration (empty without PCGrad) so DVC has a fixed output.
    atomic_write_text(metrics_dir / f"{name}-conflicts.csv",
                      pd.DataFrame(result.conflicts, columns=_conflict_columns()).to_csv(index=False))
    atomic_write_text(metrics_dir / f"{name}.json", json.dumps(metrics, indent=2) + "\n")
    resume.clear()
    return metrics


def _conflict_columns() -> list[str]:
    pairs = [f"cos_{TASKS[i]}_{TASKS[j]}" for i in range(3) for j in range(i + 1, 3)]
    return ["epoch", "step", "conflicts", "pairs", *pairs]

