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

Each run first sets aside a validation split of every task's training rows
(``minbert.data.validation``) and trains on rows drawn from the rest; with a head
warm-up (``minbert.train.head_warmup``) the heads are first fitted on the frozen
checkpoint. It is scored before its first encoder update (epoch 0) and after every
epoch on the validation split and on fixed slices of the dev and training sets (the
history); the best epoch by the
validation average is then scored once on the full dev sets, which give the
reported numbers, and predicts the test sets. Dev never chooses anything: its slice
only draws the curves of the figures.

Under ``torchrun`` the same loop runs data-parallel (``DistributedDataParallel``);
``minbert.distributed`` says how the batches, losses and outputs are split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minbert.data.batches import TokenizedTable, subsample
from minbert.data.multitask import TaskData, epoch_steps
from minbert.data.validation import carve_validation
from minbert.distributed import World
from minbert.evaluate.multitask import evaluate_multitask
from minbert.metrics import AVERAGE, METRIC, fixed
from minbert.metrics import MULTITASK_TASKS as TASKS
from minbert.model.bert import BertModel
from minbert.model.multitask import MultitaskBert
from minbert.train.head_warmup import warm_up_heads
from minbert.train.loop import BestEpoch, cpu_copy, epoch_progress
from minbert.train.multitask_step import MultitaskSettings, MultitaskStep
from minbert.train.objective import LOSS_PARTS
from minbert.train.optim import build_scheduler
from minbert.train.pcgrad import gram_stats
from minbert.train.resume import ResumePoint, generator_states, restore_generators


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
    validation_examples: dict[str, int] = field(default_factory=dict)
    head_warmup: dict[str, dict] = field(default_factory=dict)  # per task: minbert.train.head_warmup
    optimizer_steps: int = 0  # over all epochs
    examples_seen: dict[str, int] = field(default_factory=dict)  # training rows consumed, all epochs
    dev_ids: dict[str, list[str]] = field(default_factory=dict)
    test_ids: dict[str, list[str]] = field(default_factory=dict)
    model: MultitaskBert | None = None  # with the best epoch's weights


def history_row(
    epoch: int, lr: float | None, train_losses: dict[str, float], val: dict, dev: dict, train: dict
) -> dict:
    """One line of the history file: the epoch's mean training losses (none at epoch
    0), then the validation split's, the dev slice's and the training slice's losses
    and metrics (no dev columns when dev is not scored)."""
    row = {"epoch": epoch, "lr": lr, **train_losses}
    row.update({f"val_{k}": fixed(v) for k, v in val.items()})
    row.update({f"dev_{k}": fixed(v) for k, v in dev.items()})
    row.update({f"train_{k}": fixed(v) for k, v in train.items() if not k.startswith("loss_")})
    return row


def build_model(
    settings: MultitaskSettings,
    encoder: BertModel,
    device: torch.device,
    world: World = World(),
    compile_options: dict | None = None,
) -> MultitaskBert:
    """The multitask model of ``settings`` around ``encoder``, its heads drawn from the
    seed alike on every rank; afterwards each rank draws its own dropout masks. On a
    GPU the attention projections are fused (``BertModel.fuse_qkv``)."""
    torch.manual_seed(settings.seed)
    model = MultitaskBert(
        encoder,
        settings.paraphrase_head,
        settings.sts_head,
        settings.dropout,
        settings.pooling,
        settings.sts_output,
    ).to(device)
    torch.manual_seed(settings.seed + world.rank)
    if device.type == "cuda":  # one attention projection kernel instead of three
        model.encoder.fuse_qkv()
    if settings.compile:
        model.encoder.compile_layers(**(compile_options or {}))
    return model


@dataclass
class RunData:
    """The tables one run reads, as batches for its model's heads."""

    train: dict[str, TaskData]
    validation: dict[str, TaskData]  # set aside from the training split: chooses the epoch
    dev: dict[str, TaskData]
    test: dict[str, TaskData]
    slices: dict[str, dict[str, TaskData]]  # "dev" / "train": the history's fixed slices


def run_data(
    settings: MultitaskSettings, model: MultitaskBert, tables: dict[tuple[str, str], TokenizedTable]
) -> RunData:
    """The validation splits, the training subsets drawn from the rest of the training
    splits, the full dev sets, the test sets (when predicted) and the history's fixed
    slices of the dev sets and of the training examples in use."""

    def data(task: str, table: TokenizedTable, limit: int = 0, seed: int = settings.seed) -> TaskData:
        return TaskData(task, subsample(table, limit, seed), model.is_siamese(task))

    carved = {
        t: carve_validation(tables[t, "train"], settings.validation_examples[t], settings.seed) for t in TASKS
    }
    validation = {t: data(t, carved[t][1]) for t in TASKS}
    train = {t: data(t, carved[t][0], settings.train_examples[t]) for t in TASKS}
    dev = {t: data(t, tables[t, "dev"]) for t in TASKS if (t, "dev") in tables}  # none: a search
    test = {
        t: data(t, tables[t, "test"]) for t in TASKS if settings.test_predictions and (t, "test") in tables
    }
    sizes = settings.history_examples
    slices = {
        "dev": {t: data(t, d.table, sizes["dev"]) for t, d in dev.items()},
        "train": {t: data(t, train[t].table, sizes["train"], settings.seed + 1) for t in TASKS},
    }
    return RunData(train, validation, dev, test, slices)


def train_multitask(
    settings: MultitaskSettings,
    encoder: BertModel,
    tables: dict[tuple[str, str], TokenizedTable],
    device: torch.device,
    compile_options: dict | None = None,
    resume: ResumePoint | None = None,
    world: World = World(),
    score_dev: bool = True,
) -> MultitaskResult:
    """Train on rows of ``tables[(task, "train")]`` outside its validation split; score
    the validation split and fixed slices of the dev and training sets before training
    and after every epoch; select the best epoch (1 or later) by the validation
    average and score it on the full ``(task, "dev")`` tables; predict
    ``(task, "test")`` where given. Without ``score_dev`` (a learning-rate search)
    nothing of dev is scored at all.

    With several ranks (``world``), each step's global batch of a task holds
    ``world.size * batch_size`` rows, split across the ranks.
    """
    rng = np.random.default_rng(settings.seed)
    model = build_model(settings, encoder, device, world, compile_options)
    data = run_data(settings, model, tables)

    def score(tasks: dict[str, TaskData], show_progress: bool = False) -> tuple[dict, dict]:
        return evaluate_multitask(
            model, tasks, settings.eval_batch_size, device, world, show_progress and world.is_main
        )

    def score_slices() -> tuple[dict, dict, dict]:
        dev = score(data.slices["dev"])[0] if score_dev else {}
        return score(data.validation)[0], dev, score(data.slices["train"])[0]

    result = MultitaskResult()
    # Rank 0 reads the saved state and hands it to the others: on several machines
    # only its disk is sure to have it.
    saved = world.broadcast(resume.load() if resume and world.is_main else None)
    if saved is None:  # before the optimizer and SMART's teacher copy the heads
        result.head_warmup = warm_up_heads(
            model,
            data.train,
            data.validation,
            settings.head_warmup,
            {t: b * world.size for t, b in settings.batch_size.items()},  # the global batch
            settings.eval_batch_size,
            settings.weight_decay,
            device,
            settings.seed,
        )
    train_step = MultitaskStep(settings, model, data.train, device, world)
    optimizer, teacher = train_step.optimizer, train_step.teacher
    scheduler = build_scheduler(settings.lr_schedule, optimizer, gamma=settings.lr_gamma)

    best = BestEpoch()
    lengths = {t: d.lengths for t, d in data.train.items()}
    global_batch = {t: settings.batch_size[t] * world.size for t in TASKS}
    one_task_per_step = settings.gradient == "round-robin"
    batches_per_task = max(-(-len(d) // global_batch[t]) for t, d in data.train.items())
    steps_per_epoch = batches_per_task * (len(TASKS) if one_task_per_step else 1)
    global_step = 0
    seen = dict.fromkeys(TASKS, 0)
    first_epoch = 1
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        if teacher is not None:
            teacher.module.load_state_dict(saved["teacher"])
        restore_generators(saved["generators"][world.rank], rng, *train_step.generators)
        result.history, result.conflicts = saved["history"], saved["conflicts"]
        best.load_state_dict(saved["best"])
        global_step, seen = saved["global_step"], saved["examples_seen"]
        first_epoch = saved["epoch"] + 1
        result.head_warmup = saved.get("head_warmup", {})
    else:
        # Epoch 0: the untouched checkpoint, its heads fresh or fitted by the warm-up.
        result.history.append(history_row(0, None, {}, *score_slices()))
    bar, job = epoch_progress(
        "multitask", settings.epochs, steps_per_epoch, first_epoch, quiet=not world.is_main
    )
    with bar:
        if saved is not None:
            bar.console.log(f"resumed from {resume.path} after epoch {first_epoch - 1}")
        for epoch in range(first_epoch, settings.epochs + 1):
            model.train()
            lr = optimizer.param_groups[0]["lr"]
            # Loss sums stay on the device (no host synchronisation for the log).
            sums = torch.zeros(len(TASKS), len(LOSS_PARTS), device=device)
            grams: list[tuple[int, torch.Tensor]] = []  # PCGrad's, read once the epoch is done
            counts = np.zeros(len(TASKS))
            steps = epoch_steps(lengths, global_batch, rng, one_task_per_step=one_task_per_step)
            for step, rows_by_task in enumerate(steps):
                step_losses, gram = train_step(rows_by_task, epoch, step)
                sums += step_losses
                counts += [t in rows_by_task for t in TASKS]
                for t, rows in rows_by_task.items():
                    seen[t] += len(rows)
                if gram is not None:
                    grams.append((global_step, gram))
                global_step += 1
                last = train_step.guard.last
                bar.update(
                    job,
                    advance=1,
                    status=f"epoch {epoch} loss {'…' if last is None else f'{last[:, 0].sum():.3f}'}",
                )
            train_step.flush()
            result.conflicts += _conflict_rows(epoch, grams)
            scheduler.step()
            means = (sums.cpu().numpy() / counts[:, None]).tolist()
            losses = {
                f"train_{part}_{t}": fixed(means[k][j])
                for k, t in enumerate(TASKS)
                for j, part in enumerate(LOSS_PARTS)
                if settings.smart or part == "loss"
            }
            val_scores, dev_scores, train_scores = score_slices()
            result.history.append(history_row(epoch, lr, losses, val_scores, dev_scores, train_scores))
            bar.console.log(
                f"epoch {epoch}: validation "
                + ", ".join(f"{k} {val_scores[k]:.3f}" for k in (*(METRIC[t] for t in TASKS), AVERAGE))
            )
            best.offer(epoch, val_scores[AVERAGE], lambda: cpu_copy(model))
            # Collective: every rank's generators, each rank resumes from its own.
            generators = world.all_gather(generator_states(rng, *train_step.generators))
            if resume and world.is_main:
                resume.save(
                    {
                        "epoch": epoch,
                        "global_step": global_step,
                        "examples_seen": seen,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "teacher": teacher.module.state_dict() if teacher is not None else None,
                        "generators": generators,
                        "history": result.history,
                        "conflicts": result.conflicts,
                        "best": best.state_dict(),
                        "head_warmup": result.head_warmup,
                    }
                )
    model.load_state_dict(best.weights)
    result.model, result.best_epoch = model, best.epoch
    result.optimizer_steps, result.examples_seen = global_step, {t: int(n) for t, n in seen.items()}
    result.validation_examples = {t: len(d) for t, d in data.validation.items()}
    result.train_examples = {t: len(d) for t, d in data.train.items()}
    result.history_examples = {s: {t: len(d) for t, d in sliced.items()} for s, sliced in data.slices.items()}
    if not score_dev:
        return result
    bar.console.log(f"scoring epoch {best.epoch} on the full dev sets")
    result.dev, result.dev_predictions = score(data.dev, show_progress=True)
    if data.test:
        _, result.test_predictions = score(data.test, show_progress=True)
    result.dev_ids = {t: d.table.ids for t, d in data.dev.items()}
    result.test_ids = {t: d.table.ids for t, d in data.test.items()}
    return result


def conflict_columns() -> list[str]:
    pairs = [f"cos_{TASKS[i]}_{TASKS[j]}" for i in range(3) for j in range(i + 1, 3)]
    return ["epoch", "step", "conflicts", "pairs", *pairs]


def _conflict_rows(epoch: int, grams: list[tuple[int, torch.Tensor]]) -> list[dict]:
    """The conflict log of an epoch's PCGrad steps, from their Gram matrices (one
    transfer to the host for the whole epoch)."""
    if not grams:
        return []
    rows, pairs = [], len(TASKS) * (len(TASKS) - 1) // 2
    for (step, _), gram in zip(grams, torch.stack([g for _, g in grams]).cpu()):
        cos, conflicts = gram_stats(gram)
        row = {"epoch": epoch, "step": step, "conflicts": conflicts, "pairs": pairs}
        for i in range(len(TASKS)):
            for j in range(i + 1, len(TASKS)):
                row[f"cos_{TASKS[i]}_{TASKS[j]}"] = fixed(cos[i, j])
        rows.append(row)
    return rows
