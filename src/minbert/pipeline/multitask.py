"""Stage ``multitask@<config>`` (and ``multitask-mlm@<start>-<config>``): fine-tune one
configuration, as its resolved settings file says, and write its metrics file and
record, history, PCGrad log, predictions and model."""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from minbert.atomic import atomic_directory
from minbert.data.batches import TokenizedTable
from minbert.metrics import fixed
from minbert.model.bert import BertModel
from minbert.model.multitask import save_multitask
from minbert.pipeline import outputs
from minbert.pipeline.entry import stage_main
from minbert.pipeline.model_card import MODEL_CARD, dev_intervals, model_card
from minbert.pipeline.stage import Started, started
from minbert.results import EPOCH, STEPS, write_result
from minbert.settings import MultitaskSettings, RunContext
from minbert.tasks import AVERAGE, MULTITASK_TASKS, SELECTION, SPLITS, TASKS
from minbert.train.head_warmup import ProbeFeatures
from minbert.train.multitask import CONFLICT_COLUMNS, LOSS_KEYS, MultitaskResult, train_multitask
from minbert.train.resume import DEFAULT_DIRECTORY as RESUME_DIRECTORY

# The model directory's record of the training and validation rows' ids, per task.
TRAINING_IDS = "training-ids.json.gz"


def load_tables(tokenized_dir: Path) -> dict[tuple[str, str], TokenizedTable]:
    """Every multitask table the tokenize stage wrote, by (task, split); offline there is
    no Quora test split."""
    return {
        (t, s): TokenizedTable.read(tokenized_dir / f"{t}-{s}.parquet")
        for t in MULTITASK_TASKS
        for s in SPLITS
        if (tokenized_dir / f"{t}-{s}.parquet").exists()
    }


def run(
    resolved: dict,
    tokenized: Path,
    manifest: Path,
    metrics: Path,
    predictions: Path,
    checkpoint: Path | None = None,
    resume_dir: Path | None = RESUME_DIRECTORY,
    models: Path | None = None,
    features: Path | None = None,
) -> dict:
    """Train one configuration (``resolved``: its settings file's content) on the tokenised
    tables and write every output (``models``: the model and its card too). With
    ``checkpoint`` (an ``mlm@<start>`` output) training starts from it and the outputs are
    named ``<start>-<config>``. ``features``: the head warm-up's vectors. The training
    state is saved to ``resume_dir`` after every epoch; a rerun continues from it."""
    context = RunContext.of(resolved, "config")
    start = None if checkpoint is None else Path(checkpoint).name
    name = context.name if start is None else f"{start}-{context.name}"
    with started(
        context,
        "multitask",
        data_parallel=True,
        checkpoint_dir=checkpoint,
        checkpoint_name=None if start is None else f"{context.checkpoint} + MLM {start}",
    ) as stage:
        settings = MultitaskSettings.from_dict(resolved["settings"])
        tables = load_tables(Path(tokenized))
        manifest = json.loads(Path(manifest).read_text(encoding="utf-8"))
        resume = stage.resume_point(
            resume_dir,
            f"multitask-{name}",
            settings,
            data={"-".join(k): len(v) for k, v in tables.items()},
            manifest=manifest,
        )
        encoder = BertModel.from_pretrained(stage.checkpoint_dir)
        probe = None if features is None or checkpoint is not None else ProbeFeatures(features)
        result = train_multitask(
            settings, encoder, tables, stage.device, resume=resume, world=stage.world, features=probe
        )
        numbers, record = _results(context, settings, result, stage, manifest, checkpoint)
        if stage.world.is_main:
            _write(
                name,
                context,
                resolved["max_length"],
                settings,
                result,
                numbers,
                record,
                tables,
                stage,
                Path(metrics),
                Path(predictions),
                None if models is None else Path(models),
            )
            resume.clear()
        return {**record, **numbers}


def _results(
    context: RunContext,
    settings: MultitaskSettings,
    result: MultitaskResult,
    stage: Started,
    manifest: dict,
    mlm_dir: Path | None,
) -> tuple[dict, dict]:
    """The metrics file's numbers (the best epoch on the full dev sets) and the record."""
    numbers = {
        **{t: fixed(result.dev[TASKS[t].metric_key]) for t in MULTITASK_TASKS},
        AVERAGE: fixed(result.dev[AVERAGE]),
        EPOCH: result.best_epoch,
        STEPS: result.optimizer_steps,
    }
    record = {
        "config": context.name,
        "epochs": settings.epochs,
        "selection": (
            "the epoch (0, the start, or later) with the best mean of "
            + ", ".join(TASKS[t].selection_title for t in MULTITASK_TASKS)
            + " (chance-corrected: a constant answer scores 0) on the validation split, set aside "
            "from the training rows (never trained on); dev is scored with the start and with "
            "that epoch; a run that keeps epoch 0 was not helped by fine-tuning"
        ),
        # The chance-corrected scores of the chosen epoch on the full dev sets.
        "dev_selection": {
            **{TASKS[t].selection_key: fixed(result.dev[TASKS[t].selection_key]) for t in MULTITASK_TASKS},
            SELECTION: fixed(result.dev[SELECTION]),
        },
        # The model fine-tuning started from (epoch 0: fitted heads, untouched encoder) on
        # dev, each task's metric and chance-corrected score, and their means.
        "start_dev": {k: fixed(v) for k, v in result.start_dev.items() if k not in LOSS_KEYS},
        "examples_seen": result.examples_seen,
        "train_examples": result.train_examples,
        "validation_examples": result.validation_examples,
        # Heads fitted on the frozen checkpoint before fine-tuning, per task.
        "head_warmup": result.head_warmup,
        "dev_examples": {t: len(ids) for t, ids in result.dev_ids.items()},
        # The fixed slices the history scores every epoch (figures only).
        "history_examples": result.history_examples,
        "data_split": outputs.data_split(manifest),
        "settings": {
            k: v
            for k, v in asdict(settings).items()
            if k not in ("batch_size", "train_examples", "validation_examples", "history_examples", "seed")
        },
        "batch_size": settings.batch_size,
        # Data-parallel processes; each step's batch of a task is processes x batch_size.
        "processes": stage.world.size,
        "checkpoint": stage.checkpoint,
        "pretraining": None
        if mlm_dir is None
        else {"start": Path(mlm_dir).name, "directory": Path(mlm_dir).as_posix()},
        "scale": context.scale,
        "seed": settings.seed,
        "device": stage.device_name,
    }
    if settings.smart is not None:
        # The last epoch's mean smoothness term as trained, and the same term with no
        # perturbation (the control: what remains is not the perturbation's doing).
        last = result.history[-1].losses
        record["smart"] = {part: last[part] for part in ("adversarial", "adversarial_control")}
    if result.conflicts:
        conflicts = pd.DataFrame(result.conflicts)
        record["pcgrad_conflict_fraction"] = fixed(conflicts.conflicts.sum() / conflicts.pairs.sum())
    return numbers, record


def _write(name, context, max_length, settings, result, numbers, record, tables, stage, metrics_dir,
           predictions_dir, models_dir) -> None:  # fmt: skip
    """Every output of rank 0."""
    for task in MULTITASK_TASKS:
        for split, ids, predicted in (
            ("dev", result.dev_ids, result.dev_predictions),
            ("dev-start", result.dev_ids, result.start_predictions),
            ("test", result.test_ids, result.test_predictions),
        ):
            if task in predicted:
                path = predictions_dir / name / f"{task}-{split}-out.csv"
                outputs.write_predictions(path, task, ids[task], predicted[task])
    if models_dir is not None:
        info = {
            "config": name,
            "max_length": max_length,
            "eval_batch_size": settings.eval_batch_size,
            "best_epoch": result.best_epoch,
            "dev": {k: numbers[k] for k in (*MULTITASK_TASKS, AVERAGE)},
            "dev_examples": record["dev_examples"],
            "checkpoint": stage.checkpoint,
            "scale": context.scale,
            "seed": settings.seed,
        }
        card = model_card(
            name, numbers, record, dev_intervals(result, tables), (models_dir / name).as_posix()
        )
        with atomic_directory(models_dir / name) as directory:
            save_multitask(result.model.to("cpu"), directory, stage.checkpoint_dir / "vocab.txt", info)
            (directory / MODEL_CARD).write_text(card, encoding="utf-8")
            # Which rows the model learned from, so that scoring it on them can be caught.
            ids = json.dumps({"tasks": result.training_ids}, sort_keys=True).encode("utf-8")
            (directory / TRAINING_IDS).write_bytes(gzip.compress(ids, mtime=0))
    outputs.write_history(metrics_dir / f"{name}-history.csv", [epoch.row() for epoch in result.history])
    outputs.write_conflicts(metrics_dir / f"{name}-conflicts.csv", result.conflicts, CONFLICT_COLUMNS)
    write_result(metrics_dir, name, numbers, record)


# ``--checkpoint``: an MLM stage's output to fine-tune from (stage multitask-mlm).
main = stage_main(
    run, "tokenized", "manifest", "metrics", "predictions", "models", optional=("checkpoint", "features")
)
