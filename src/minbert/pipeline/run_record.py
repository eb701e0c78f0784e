"""One multitask run as its outputs state it: a typed record made once from what training
returned, of which the run's files (``file``, written by ``minbert.runs.training``), the
model's ``minbert.json`` info and its model card (``minbert.pipeline.model_card``) are
serialisations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minbert.metrics import fixed
from minbert.pipeline import outputs
from minbert.pipeline.stage import Started
from minbert.runs.record_parts import (
    AppliedRate,
    Checkpoint,
    DataSplit,
    Pretraining,
    RecordedSettings,
    SmartTerms,
    StepExecution,
    WarmupKept,
)
from minbert.runs.training import MultitaskRunFile
from minbert.settings import MultitaskSettings, RunContext
from minbert.tasks import AVERAGE, MULTITASK_TASKS, SELECTION, TASKS
from minbert.train.multitask import LOSS_KEYS, MultitaskResult

# What chose the kept epoch, as every record states it.
SELECTION_RULE = (
    "the epoch (0, the start, or later) with the best mean of "
    + ", ".join(TASKS[t].selection_title for t in MULTITASK_TASKS)
    + " (chance-corrected: a constant answer scores 0) on the validation split, set aside "
    "from the training rows (never trained on); dev is scored with the start and with "
    "that epoch; a run that keeps epoch 0 was not helped by fine-tuning"
)


@dataclass(frozen=True)
class MultitaskRun:
    context: RunContext
    settings: MultitaskSettings
    best_epoch: int
    optimizer_steps: int
    applied_lr: list[tuple[int, float, float]]  # per epoch: the encoder's rate at its first, last step
    dev: dict[str, float]  # the kept epoch on the full dev sets, every score
    start_dev: dict[str, float]  # the start (epoch 0: fitted heads, untouched encoder) on dev
    examples_seen: dict[str, int]
    train_examples: dict[str, int]
    validation_examples: dict[str, int]
    dev_examples: dict[str, int]
    history_examples: dict[str, dict[str, int]]
    head_warmup: dict[str, dict]  # per task: minbert.train.head_warmup
    data_split: dict  # which data the numbers come from (the data stage's manifest)
    processes: int  # data-parallel; each step's batch of a task is processes x batch_size
    checkpoint: dict  # minbert.model.checkpoint.describe_checkpoint
    pretraining: dict | None  # the MLM stage the run started from
    device: str
    smart_terms: dict[str, float] | None  # the last epoch's R_s as trained and its control
    pcgrad_conflict_fraction: float | None  # of task pairs over all steps
    step_execution: StepExecution  # eager or from CUDA graphs, and why

    @classmethod
    def of(
        cls,
        context: RunContext,
        settings: MultitaskSettings,
        result: MultitaskResult,
        stage: Started,
        manifest: dict,
        mlm_dir: Path | None,
    ) -> MultitaskRun:
        conflicts = result.conflicts
        return cls(
            context=context,
            settings=settings,
            best_epoch=result.best_epoch,
            optimizer_steps=result.optimizer_steps,
            applied_lr=result.applied_lr,
            dev=result.dev,
            start_dev={k: v for k, v in result.start_dev.items() if k not in LOSS_KEYS},
            examples_seen=result.examples_seen,
            train_examples=result.train_examples,
            validation_examples=result.validation_examples,
            dev_examples={t: len(ids) for t, ids in result.dev_ids.items()},
            history_examples=result.history_examples,
            head_warmup=result.head_warmup,
            data_split=outputs.data_split(manifest),
            processes=stage.world.size,
            checkpoint=stage.checkpoint,
            pretraining=None
            if mlm_dir is None
            else {"start": Path(mlm_dir).name, "directory": Path(mlm_dir).as_posix()},
            device=stage.device_name,
            smart_terms=None
            if settings.smart is None
            else {p: result.history[-1].losses[p] for p in ("adversarial", "adversarial_control")},
            pcgrad_conflict_fraction=fixed(
                sum(c["conflicts"] for c in conflicts) / sum(c["pairs"] for c in conflicts)
            )
            if conflicts
            else None,
            step_execution=StepExecution(settings.cuda_graphs, *result.steps_from),
        )

    def dev_scores(self) -> dict[str, float]:
        """Each task's metric and their average on dev, at the kept epoch."""
        return {
            **{t: fixed(self.dev[TASKS[t].metric_key]) for t in MULTITASK_TASKS},
            AVERAGE: fixed(self.dev[AVERAGE]),
        }

    def file(self) -> MultitaskRunFile:
        """The run's metrics file and record, typed (``minbert.runs.training`` writes them)."""
        s = self.settings
        return MultitaskRunFile(
            config=self.context.name,
            scores=self.dev_scores(),
            epoch=self.best_epoch,
            steps=self.optimizer_steps,
            epochs=s.epochs,
            selection=SELECTION_RULE,
            # The chance-corrected scores of the kept epoch on the full dev sets.
            dev_selection={
                **{TASKS[t].selection_key: fixed(self.dev[TASKS[t].selection_key]) for t in MULTITASK_TASKS},
                SELECTION: fixed(self.dev[SELECTION]),
            },
            start_dev={k: fixed(v) for k, v in self.start_dev.items()},
            examples_seen=self.examples_seen,
            train_examples=self.train_examples,
            validation_examples=self.validation_examples,
            head_warmup={t: WarmupKept(**kept) for t, kept in self.head_warmup.items()},
            dev_examples=self.dev_examples,
            history_examples=self.history_examples,
            data_split=DataSplit.from_dict(self.data_split),
            settings=RecordedSettings.of(s),
            batch_size=s.batch_size,
            processes=self.processes,
            checkpoint=Checkpoint.from_dict(self.checkpoint),
            pretraining=None if self.pretraining is None else Pretraining(**self.pretraining),
            scale=self.context.scale,
            seed=s.seed,
            device=self.device,
            smart=None if self.smart_terms is None else SmartTerms(**self.smart_terms),
            pcgrad_conflict_fraction=self.pcgrad_conflict_fraction,
            applied_lr=[AppliedRate(e, float(f"{a:.6g}"), float(f"{b:.6g}")) for e, a, b in self.applied_lr],
            step_execution=self.step_execution,
            batches_per_step=s.batches_per_step if s.batches_per_step > 1 else None,
        )

    def model_info(self, name: str, max_length: dict[str, int]) -> dict:
        """What the model directory's ``minbert.json`` says of the run that made it."""
        return {
            "config": name,
            "max_length": max_length,
            "eval_batch_size": self.settings.eval_batch_size,
            "best_epoch": self.best_epoch,
            "dev": self.dev_scores(),
            "dev_examples": self.dev_examples,
            "checkpoint": self.checkpoint,
            "scale": self.context.scale,
            "seed": self.settings.seed,
        }
