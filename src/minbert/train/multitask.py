"""Multitask fine-tuning of one configuration: the run's data, its epochs (each step a
``MultitaskStep``), the epoch chosen on the validation split, then dev and test scored
once. How the tasks share the steps, and what a run chooses on: docs/pipeline.md."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minbert.data.batches import TokenizedTable
from minbert.data.multitask import TaskData, epoch_steps, steps_per_epoch
from minbert.distributed import World
from minbert.evaluate.multitask import evaluate_multitask
from minbert.metrics import fixed
from minbert.model.bert import BertModel
from minbert.model.multitask import MultitaskBert
from minbert.progress import console
from minbert.results import TASK_PAIRS, EpochScores, cosine_column, loss_part_column
from minbert.settings import MultitaskSettings
from minbert.tasks import MULTITASK_TASKS, SELECTION, TASKS
from minbert.train.head_warmup import ProbeFeatures
from minbert.train.loop import Epochs
from minbert.train.multitask_step import MultitaskObserver, MultitaskStep
from minbert.train.optim import Schedule
from minbert.train.pcgrad import gram_stats
from minbert.train.resume import ResumePoint, generator_states, restore_generators
from minbert.train.smart import LOSS_PARTS, EmaTeacher
from minbert.train.start import RunData, start
from minbert.train.step_execution import check_plan, choose_steps

# The per-task losses among a scoring pass's keys.
LOSS_KEYS = frozenset(TASKS[t].loss_key for t in MULTITASK_TASKS)


@dataclass
class MultitaskResult:
    history: list[EpochScores] = field(default_factory=list)
    conflicts: list[dict] = field(default_factory=list)
    step_losses: list[dict] = field(default_factory=list)  # every LOSS_LOG_STEPS steps (STEP_LOSS_COLUMNS)
    best_epoch: int = 0
    dev: dict = field(default_factory=dict)  # the best epoch's scores on the full dev sets
    dev_predictions: dict[str, np.ndarray] = field(default_factory=dict)
    # The model fine-tuning starts from (fitted heads, untouched encoder, epoch 0) on the
    # full dev sets: what every result of the run is compared with.
    start_dev: dict = field(default_factory=dict)
    start_predictions: dict[str, np.ndarray] = field(default_factory=dict)
    test_predictions: dict[str, np.ndarray] = field(default_factory=dict)
    train_examples: dict[str, int] = field(default_factory=dict)
    history_examples: dict[str, dict[str, int]] = field(default_factory=dict)
    validation_examples: dict[str, int] = field(default_factory=dict)
    head_warmup: dict[str, dict] = field(default_factory=dict)  # per task: minbert.train.head_warmup
    optimizer_steps: int = 0  # over all epochs
    # Per epoch: (epoch, the encoder's rate at its first optimizer step, at its last).
    applied_lr: list[tuple[int, float, float]] = field(default_factory=list)
    examples_seen: dict[str, int] = field(default_factory=dict)  # training rows consumed, all epochs
    dev_ids: dict[str, list[str]] = field(default_factory=dict)
    test_ids: dict[str, list[str]] = field(default_factory=dict)
    # Per task, the ids of the training rows the model learned from (the heads' warm-up and
    # fine-tuning read the same rows) and of the validation rows.
    training_ids: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    model: MultitaskBert | None = None  # with the best epoch's weights
    # Whether the steps ran from CUDA graphs, and why (minbert.train.step_execution).
    steps_from: tuple[bool, str] = (False, "")


def _epoch_scores(
    epoch: int, lr: float | None, losses: dict, val: dict, dev: dict, train: dict
) -> EpochScores:
    """An epoch's history line from the scores as ``evaluate_multitask`` returns them (the
    training slice's losses left out: the epoch's mean training losses stand there)."""
    return EpochScores(
        epoch,
        lr,
        losses,
        {k: fixed(v) for k, v in val.items()},
        {k: fixed(v) for k, v in dev.items()},
        {k: fixed(v) for k, v in train.items() if k not in LOSS_KEYS},
    )


# Resumed runs load their saved history with ``weights_only=True``.
torch.serialization.add_safe_globals([EpochScores])


def train_multitask(
    settings: MultitaskSettings,
    encoder: BertModel,
    tables: dict[tuple[str, str], TokenizedTable],
    device: torch.device,
    compile_options: dict | None = None,
    resume: ResumePoint | None = None,
    world: World = World(),
    score_dev: bool = True,
    features: ProbeFeatures | None = None,
    observer: MultitaskObserver | None = None,
) -> MultitaskResult:
    """Train on the training rows outside each task's validation split, scoring the
    validation split and the history's slices before training and after every epoch, and
    the full dev tables before training (the start every result is compared with); keep
    the best epoch (0, the start, or later) by the validation selection score, score it
    on the full dev tables and predict the test tables. Without ``score_dev`` (a
    learning-rate search) nothing of dev is scored. ``features``: the head warm-up's frozen vectors;
    ``observer``: what a benchmark or test watches of the steps and epochs.
    Under several ranks a task's global batch is ``world.size * batch_size`` rows."""
    epochs = Epochs(resume, world)
    # Heads fitted before the optimizer and SMART's teacher copy them (not when resuming).
    model, data, warmup = start(
        settings, encoder, tables, device, world, compile_options, features, fit_heads=not epochs.resumed
    )
    loop = _MultitaskEpochs(settings, model, data, device, world, score_dev, warmup, features, observer)
    if score_dev and not epochs.resumed:
        loop.start_dev, loop.start_predictions = loop.score(data.dev, vectors=loop.frozen(data.dev, "dev"))
    history, best_epoch = epochs.run(loop, settings.epochs, "multitask")
    result = MultitaskResult(
        history=history,
        conflicts=loop.conflicts,
        step_losses=loop.step_losses,
        best_epoch=best_epoch,
        start_dev=loop.start_dev,
        start_predictions=loop.start_predictions,
        train_examples={t: len(d) for t, d in data.train.items()},
        history_examples={s: {t: len(d) for t, d in sliced.items()} for s, sliced in data.slices.items()},
        validation_examples={t: len(d) for t, d in data.validation.items()},
        head_warmup=loop.head_warmup,
        optimizer_steps=loop.global_step,
        applied_lr=loop.applied_lr,
        examples_seen={t: int(n) for t, n in loop.seen.items()},
        training_ids={
            t: {"trained": data.train[t].table.ids, "validation": data.validation[t].table.ids}
            for t in MULTITASK_TASKS
        },
        model=model,  # with the best epoch's weights
        steps_from=loop.steps_from,
    )
    if not score_dev:
        return result
    if result.best_epoch == 0:  # the start is kept: dev was scored with it
        result.dev, result.dev_predictions = loop.start_dev, loop.start_predictions
    else:
        if world.is_main:
            console.log(f"scoring epoch {result.best_epoch} on the full dev sets")
        result.dev, result.dev_predictions = loop.score(data.dev, show_progress=True)
    if data.test:
        _, result.test_predictions = loop.score(data.test, show_progress=True)
    result.dev_ids = {t: d.table.ids for t, d in data.dev.items()}
    result.test_ids = {t: d.table.ids for t, d in data.test.items()}
    return result


class _MultitaskEpochs:
    """An epoch for the epoch driver: the steps, each task's mean losses, PCGrad's
    conflicts, the schedule's step, then the scores. Keeps, and resumes with, the run's
    PCGrad log, training-loss log, warm-up report and start predictions."""

    def __init__(
        self,
        settings: MultitaskSettings,
        model: MultitaskBert,
        data: RunData,
        device: torch.device,
        world: World,
        score_dev: bool,
        head_warmup: dict[str, dict],
        features: ProbeFeatures | None = None,
        observer: MultitaskObserver | None = None,
    ):
        self.settings, self.model, self.data, self.device, self.world = settings, model, data, device, world
        self.score_dev, self.head_warmup, self.features = score_dev, head_warmup, features
        self.observer = observer or MultitaskObserver()
        self.conflicts: list[dict] = []
        self.step_losses: list[dict] = []
        self.start_dev: dict = {}
        self.start_predictions: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng(settings.seed)
        # Graphs need an optimizer whose rate and step counts live on the device.
        capturable = settings.cuda_graphs and device.type == "cuda"
        self.train_step = MultitaskStep(
            settings, model, data.train, device, world, self.observer, capturable=capturable
        )
        self.steps, self.steps_from = None, (False, "")  # chosen at the first epoch (choose_steps)
        self.global_batch = {t: settings.batch_size[t] * world.size for t in MULTITASK_TASKS}
        self.one_task_per_step = settings.gradient == "round-robin"
        batches = max(-(-len(d) // self.global_batch[t]) for t, d in data.train.items())
        self.steps_per_epoch = steps_per_epoch(
            batches, len(MULTITASK_TASKS), one_task_per_step=self.one_task_per_step,
            batches_per_step=settings.batches_per_step,
        )  # fmt: skip
        self.schedule = Schedule(
            settings.lr_schedule, self.train_step.optimizer, settings.lr_gamma, self.steps_per_epoch
        )
        # (epoch, the encoder's rate at the epoch's first optimizer step, at its last): as applied.
        self.applied_lr: list[tuple[int, float, float]] = []
        self.global_step, self.seen = 0, dict.fromkeys(MULTITASK_TASKS, 0)

    def score(
        self, tasks: dict[str, TaskData], show_progress: bool = False, vectors=None
    ) -> tuple[dict, dict]:
        return evaluate_multitask(
            self.model, tasks, self.settings.eval_batch_size, self.device, self.world,
            show_progress and self.world.is_main, vectors,
        )  # fmt: skip

    def frozen(self, tasks: dict[str, TaskData], split: str) -> dict[str, torch.Tensor] | None:
        """The features stage's vectors of ``tasks`` (rows of ``split``) where it has them
        all: what the untouched checkpoint gives, so only before the first step."""
        if self.features is None or self.global_step > 0:
            return None
        return self.features.covered(tasks, split)

    def _slices(self, at_start: bool = False) -> tuple[dict, dict, dict]:
        """The validation split's scores, the dev slice's (none without dev) and the
        training slice's; at the start from the features stage's vectors where it has them."""
        validation, dev_slice, train_slice = (
            self.data.validation,
            self.data.slices["dev"],
            self.data.slices["train"],
        )
        frozen = self.frozen if at_start else lambda tasks, split: None
        dev = self.score(dev_slice, vectors=frozen(dev_slice, "dev"))[0] if self.score_dev else {}
        return (
            self.score(validation, vectors=frozen(validation, "train"))[0],
            dev,
            self.score(train_slice, vectors=frozen(train_slice, "train"))[0],
        )

    def before(self):
        # Epoch 0: the untouched checkpoint, its heads fresh or fitted by the warm-up.
        val_scores, dev_scores, train_scores = self._slices(at_start=True)
        row = _epoch_scores(0, None, {}, val_scores, dev_scores, train_scores)
        self.observer.epoch(row, self.model, self.teacher)
        return row, val_scores[SELECTION]

    def epoch(self, epoch, step, log):
        self.model.train()
        lr = float(self.train_step.optimizer.param_groups[0]["lr"])
        # Loss sums stay on the device (no host synchronisation for the log).
        sums = torch.zeros(len(MULTITASK_TASKS), len(LOSS_PARTS), device=self.device)
        grams: list[tuple[int, torch.Tensor]] = []  # PCGrad's, read once the epoch is done
        counts = np.zeros(len(MULTITASK_TASKS))
        # The training loss every LOSS_LOG_STEPS steps, read once the epoch is done.
        window = torch.zeros(len(MULTITASK_TASKS), device=self.device)
        window_counts, logged = np.zeros(len(MULTITASK_TASKS)), []
        lengths = {t: d.lengths for t, d in self.data.train.items()}
        one_task, merged = self.one_task_per_step, self.settings.batches_per_step
        batches = epoch_steps(
            lengths, self.global_batch, self.rng, one_task_per_step=one_task, batches_per_step=merged
        )
        optimizer = self.train_step.optimizer
        if self.steps is None:  # after the heads' warm-up, before the first step
            plan = check_plan(lengths, self.global_batch, self.settings.seed, one_task, merged)
            self.steps, graphs, why = choose_steps(self.train_step, self.settings.cuda_graphs, plan)
            self.steps_from = (graphs, why)
        for index, rows_by_task in enumerate(batches):
            last_lr = _rate(optimizer)
            step_losses, gram = self.steps(rows_by_task, epoch, index)
            self.schedule.after_step()
            sums += step_losses
            present = [t in rows_by_task for t in MULTITASK_TASKS]
            counts += present
            window += step_losses[:, 0]
            window_counts += present
            for t, rows in rows_by_task.items():
                self.seen[t] += len(rows)
            if gram is not None:
                grams.append((self.global_step, gram))
            self.global_step += 1
            if (index + 1) % LOSS_LOG_STEPS == 0:  # windows from the epoch's start
                logged.append((self.global_step, window.clone(), window_counts))
                window.zero_()
                window_counts = np.zeros(len(MULTITASK_TASKS))
            last = self.train_step.guard.last
            step(f"epoch {epoch} loss {'…' if last is None else f'{last[:, 0].sum():.3f}'}")
        self.train_step.flush()
        if window_counts.any():  # the epoch's last, shorter window; joined to the one before
            if logged and not window_counts.all():  # when it misses a task (round-robin's tail)
                _, before, before_counts = logged.pop()
                window, window_counts = window + before, window_counts + before_counts
            logged.append((self.global_step, window, window_counts))
        self.conflicts += _conflict_rows(epoch, grams)
        self.step_losses += _step_loss_rows(epoch, logged)
        self.schedule.after_epoch()
        if self.steps is not self.train_step:  # graphs hold the rate they were captured with
            self.steps.reset()
        self.applied_lr.append((epoch, lr, float(last_lr)))
        means = (sums.cpu().numpy() / counts[:, None]).tolist()
        parts = LOSS_PARTS if self.settings.smart else ("loss",)
        losses = {
            part: {t: fixed(means[k][LOSS_PARTS.index(part)]) for k, t in enumerate(MULTITASK_TASKS)}
            for part in parts
        }
        val_scores, dev_scores, train_scores = self._slices()
        titles = (*(TASKS[t].selection_key for t in MULTITASK_TASKS), SELECTION)
        log(f"epoch {epoch}: validation " + ", ".join(f"{k} {val_scores[k]:.3f}" for k in titles))
        row = _epoch_scores(epoch, lr, losses, val_scores, dev_scores, train_scores)
        self.observer.epoch(row, self.model, self.teacher)
        return row, val_scores[SELECTION]

    @property
    def teacher(self) -> EmaTeacher | None:
        return None if self.train_step.smart is None else self.train_step.smart.teacher

    def state(self) -> dict:
        # Collective: every rank's generators, each rank resumes from its own.
        generators = self.world.all_gather(generator_states(self.rng, *self.train_step.generators))
        smart = self.train_step.smart
        return {
            "global_step": self.global_step,
            "examples_seen": self.seen,
            "model": self.model.state_dict(),
            "optimizer": self.train_step.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "applied_lr": self.applied_lr,
            "teacher": smart.teacher.module.state_dict() if smart is not None else None,
            "generators": generators,
            "conflicts": self.conflicts,
            "step_losses": self.step_losses,
            "head_warmup": self.head_warmup,
            # As lists: the saved state loads with torch.load(weights_only=True), no numpy.
            "start_dev": self.start_dev,
            "start_predictions": {t: p.tolist() for t, p in self.start_predictions.items()},
        }

    def load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.train_step.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["scheduler"])
        self.applied_lr = [tuple(a) for a in state["applied_lr"]]
        if self.train_step.smart is not None:
            self.train_step.smart.teacher.module.load_state_dict(state["teacher"])
        restore_generators(state["generators"][self.world.rank], self.rng, *self.train_step.generators)
        self.conflicts, self.head_warmup = state["conflicts"], state["head_warmup"]
        self.step_losses = state["step_losses"]
        self.start_dev = state["start_dev"]
        self.start_predictions = {t: np.asarray(p) for t, p in state["start_predictions"].items()}
        self.global_step, self.seen = state["global_step"], state["examples_seen"]


def _rate(optimizer: torch.optim.Optimizer) -> float | torch.Tensor:
    """The encoder's rate now: a capturable optimizer's is a device tensor, copied on the
    device (read once the epoch is done, never a host wait a step)."""
    lr = optimizer.param_groups[0]["lr"]
    return lr.clone() if torch.is_tensor(lr) else lr


# The training-loss log: each task's mean loss over the steps of a window that trained it
# (blank where none did), a window every LOSS_LOG_STEPS optimizer steps, the last of an
# epoch shorter: a curve within an epoch, small at any scale.
LOSS_LOG_STEPS = 16
STEP_LOSS_COLUMNS = ["epoch", "step", *(loss_part_column("loss", t) for t in MULTITASK_TASKS)]


def _step_loss_rows(epoch: int, logged: list[tuple[int, torch.Tensor, np.ndarray]]) -> list[dict]:
    if not logged:
        return []
    sums = torch.stack([s for _, s, _ in logged]).cpu().numpy()  # one transfer for the epoch
    rows = []
    for (step, _, counts), totals in zip(logged, sums):
        means = {
            loss_part_column("loss", t): fixed(totals[k] / counts[k]) if counts[k] else None
            for k, t in enumerate(MULTITASK_TASKS)
        }
        rows.append({"epoch": epoch, "step": step, **means})
    return rows


# PCGrad's log: per step, the cosine of each pair of task gradients (i < j, the Gram
# matrix's upper triangle), by column name.
_PAIRS = {cosine_column(a, b): (MULTITASK_TASKS.index(a), MULTITASK_TASKS.index(b)) for a, b in TASK_PAIRS}
CONFLICT_COLUMNS = ["epoch", "step", "conflicts", "pairs", *_PAIRS]


def _conflict_rows(epoch: int, grams: list[tuple[int, torch.Tensor]]) -> list[dict]:
    """The conflict log of an epoch's PCGrad steps, from their Gram matrices (one
    transfer to the host for the whole epoch)."""
    if not grams:
        return []
    rows = []
    for (step, _), gram in zip(grams, torch.stack([g for _, g in grams]).cpu()):
        cos, conflicts = gram_stats(gram)
        row = {"epoch": epoch, "step": step, "conflicts": conflicts, "pairs": len(_PAIRS)}
        rows.append(row | {name: fixed(cos[i, j]) for name, (i, j) in _PAIRS.items()})
    return rows
