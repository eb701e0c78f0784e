"""Stage ``multitask@<config>`` (and ``multitask-mlm@<start>-<config>``): fine-tune one
configuration and write its metrics, history, PCGrad log and predictions.

The stage reads its settings from the file the ``resolve`` stage wrote for it
(``data/settings/multitask/<config>.json``, see ``minbert.pipeline.settings``), not
from ``params.yaml``: DVC then reruns it only when its own resolved settings change.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from minbert import distributed
from minbert.atomic import atomic_directory
from minbert.data.batches import TokenizedTable
from minbert.device import describe, pin_cpu_kernels
from minbert.errors import reported
from minbert.metrics import AVERAGE, METRIC, MULTITASK_TASKS, fixed
from minbert.model.bert import BertModel
from minbert.model.checkpoint import describe_checkpoint, resolve_checkpoint
from minbert.model.multitask import save_multitask
from minbert.pipeline import outputs
from minbert.pipeline.model_card import MODEL_CARD, dev_intervals, model_card
from minbert.results import EPOCH, STEPS, write_result
from minbert.train.multitask import conflict_columns, train_multitask
from minbert.train.multitask_step import MultitaskSettings
from minbert.train.resume import DEFAULT_DIRECTORY as RESUME_DIRECTORY
from minbert.train.resume import ResumePoint, fingerprint

SPLITS = ("train", "dev", "test")
# Quora's official training pairs (the paper's Section 4.2: 141,506 / 20,215 / 40,431):
# the number its batch of 36 was sized for.
QUORA_OFFICIAL_TRAIN_PAIRS = 141_506


def quora_batch_size(settings: MultitaskSettings, manifest: dict) -> int:
    """The Quora batch a run uses. With the official split, or the ``fixed`` rule, or a
    training subset, the configured one. With a carved split (``quora_split.kind``
    ``carved-from-dev``, about 16k training pairs) and ``paper-proportions``, the
    configured batch scaled by carved / official training pairs, so each task's
    batches per epoch keep the paper's proportions: at the paper's batches 2 / 36 / 2
    an epoch is SST 4,272, Quora 3,931 and STS 3,020 batches, and an unscaled 36 on
    the carved pairs would give Quora 450 batches, each repeated 9.5 times per epoch.
    """
    batch = settings.batch_size["quora"]
    split = manifest["quora_split"]
    if (
        settings.carved_quora_batch == "fixed"
        or split["kind"] == "official"
        or settings.train_examples["quora"]
    ):
        return batch
    pairs = split["train_pairs"] - settings.validation_examples["quora"]
    return max(1, round(batch * pairs / QUORA_OFFICIAL_TRAIN_PAIRS))


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
    tokenized_dir: Path,
    manifest_file: Path,
    metrics_dir: Path,
    predictions_dir: Path,
    mlm_dir: Path | None = None,
    resume_dir: Path | None = RESUME_DIRECTORY,
    models_dir: Path | None = None,
) -> dict:
    """Train one configuration (``resolved``: its resolved settings file's content,
    ``minbert.pipeline.settings.resolve_multitask``) and write every output: metrics,
    history, PCGrad log, predictions and, with ``models_dir``, the fine-tuned model
    (``models_dir/<name>/``, see ``minbert.model.multitask.save_multitask``).

    With ``mlm_dir`` (an ``mlm@<start>`` stage's output) fine-tuning starts from that
    pretrained checkpoint instead of the configured one, and the outputs are named
    ``<start>-<config>``. Training state is saved to ``resume_dir`` after every epoch,
    and a rerun of an interrupted stage continues from it.
    """
    pin_cpu_kernels()
    world, device = distributed.start(resolved["device"])
    paths = dict(
        tokenized_dir=Path(tokenized_dir),
        manifest_file=Path(manifest_file),
        metrics_dir=Path(metrics_dir),
        predictions_dir=Path(predictions_dir),
        models_dir=None if models_dir is None else Path(models_dir),
    )
    try:
        return _run(resolved, world, device, mlm_dir=mlm_dir, resume_dir=resume_dir, **paths)
    finally:
        distributed.stop(world)


def _run(
    resolved,
    world,
    device,
    *,
    tokenized_dir,
    manifest_file,
    metrics_dir,
    predictions_dir,
    models_dir,
    mlm_dir,
    resume_dir,
) -> dict:
    config, settings = resolved["config"], MultitaskSettings.from_dict(resolved["settings"])
    checkpoint_dir = resolve_checkpoint(resolved["checkpoint"]) if mlm_dir is None else Path(mlm_dir)
    name = config if mlm_dir is None else f"{Path(mlm_dir).name}-{config}"
    tables = load_tables(tokenized_dir)
    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    settings = replace(
        settings, batch_size={**settings.batch_size, "quora": quora_batch_size(settings, manifest)}
    )
    checkpoint = describe_checkpoint(
        resolved["checkpoint"] if mlm_dir is None else f"{resolved['checkpoint']} + MLM {Path(mlm_dir).name}",
        checkpoint_dir,
    )
    resume = ResumePoint(
        resume_dir,
        f"multitask-{name}",
        fingerprint(
            settings=asdict(settings),
            checkpoint=checkpoint,
            device=device.type,
            processes=world.size,
            data={"-".join(k): len(v) for k, v in tables.items()},
            manifest=manifest,
        ),
    )
    result = train_multitask(
        settings, BertModel.from_pretrained(checkpoint_dir), tables, device, resume=resume, world=world
    )

    numbers = {
        # The best epoch on the full dev sets.
        **{t: fixed(result.dev[METRIC[t]]) for t in MULTITASK_TASKS},
        AVERAGE: fixed(result.dev[AVERAGE]),
        EPOCH: result.best_epoch,
        STEPS: result.optimizer_steps,
    }
    record = {
        "config": config,
        "epochs": settings.epochs,
        "selection": (
            "the epoch (1 or later) with the best average on the validation split, set aside "
            "from the training rows (never trained on); dev is scored once, with that epoch"
        ),
        "examples_seen": result.examples_seen,
        "train_examples": result.train_examples,
        "validation_examples": result.validation_examples,
        # Heads fitted on the frozen checkpoint before fine-tuning, per task.
        "head_warmup": result.head_warmup,
        "dev_examples": {t: len(ids) for t, ids in result.dev_ids.items()},
        # The fixed slices the history scores every epoch (figures only).
        "history_examples": result.history_examples,
        "data_split": {
            "sst": "course train / dev",
            "sts": "course train / dev",
            "quora": manifest["quora_split"],
        },
        "settings": {
            k: v
            for k, v in asdict(settings).items()
            if k not in ("batch_size", "train_examples", "validation_examples", "history_examples", "seed")
        },
        "batch_size": settings.batch_size,
        # Data-parallel processes; each step's batch of a task is processes x batch_size.
        "processes": world.size,
        "checkpoint": checkpoint,
        "pretraining": None
        if mlm_dir is None
        else {"start": Path(mlm_dir).name, "directory": Path(mlm_dir).as_posix()},
        "scale": resolved["scale"],
        "seed": settings.seed,
        "device": describe(device) if world.size == 1 else f"{world.size} x {describe(device)}",
    }
    if settings.smart is not None:
        # The last epoch's mean smoothness term as trained, and the same term with no
        # perturbation (the control: what remains is not the perturbation's doing).
        last = result.history[-1]
        record["smart"] = {
            part: {t: last[f"train_{part}_{t}"] for t in MULTITASK_TASKS}
            for part in ("adversarial", "adversarial_control")
        }
    if not world.is_main:
        return {**record, **numbers}
    if result.conflicts:
        conflicts = pd.DataFrame(result.conflicts)
        record["pcgrad_conflict_fraction"] = fixed(conflicts.conflicts.sum() / conflicts.pairs.sum())
    for task in MULTITASK_TASKS:
        outputs.write_predictions(
            predictions_dir / name / f"{task}-dev-out.csv",
            task,
            result.dev_ids[task],
            result.dev_predictions[task],
        )
        if task in result.test_predictions:
            outputs.write_predictions(
                predictions_dir / name / f"{task}-test-out.csv",
                task,
                result.test_ids[task],
                result.test_predictions[task],
            )
    if models_dir is not None:
        info = {
            "config": name,
            "max_length": resolved["max_length"],
            "eval_batch_size": settings.eval_batch_size,
            "best_epoch": result.best_epoch,
            "dev": {k: numbers[k] for k in (*MULTITASK_TASKS, AVERAGE)},
            "dev_examples": record["dev_examples"],
            "checkpoint": checkpoint,
            "scale": resolved["scale"],
            "seed": settings.seed,
        }
        card = model_card(
            name, numbers, record, dev_intervals(result, tables), (models_dir / name).as_posix()
        )
        with atomic_directory(models_dir / name) as directory:
            save_multitask(result.model.to("cpu"), directory, checkpoint_dir / "vocab.txt", info)
            (directory / MODEL_CARD).write_text(card, encoding="utf-8")
    outputs.write_history(metrics_dir / f"{name}-history.csv", result.history)
    outputs.write_conflicts(metrics_dir / f"{name}-conflicts.csv", result.conflicts, conflict_columns())
    write_result(metrics_dir, name, numbers, record)
    resume.clear()
    return {**record, **numbers}


@reported
def main(
    argv: list[str],
    settings_dir: Path,
    tokenized_dir: Path,
    manifest_file: Path,
    metrics_root: Path,
    predictions_root: Path,
    models_root: Path,
) -> dict:
    """The stage script's work: ``argv`` is ``<config> [<mlm start>]``. Outputs go to
    ``<root>/multitask/`` (``<root>/multitask-mlm/`` after MLM); the MLM checkpoint is
    ``<models_root>/mlm/<start>``."""
    config, mlm_start = argv[0], (argv[1] if len(argv) > 1 else None)
    resolved = outputs.read_settings(Path(settings_dir) / f"{config}.json")
    folder = "multitask" if mlm_start is None else "multitask-mlm"
    return run(
        resolved,
        tokenized_dir,
        manifest_file,
        Path(metrics_root) / folder,
        Path(predictions_root) / folder,
        mlm_dir=None if mlm_start is None else Path(models_root) / "mlm" / mlm_start,
        models_dir=Path(models_root) / folder,
    )
