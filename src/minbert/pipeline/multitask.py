"""Stage ``multitask@<config>`` (and ``multitask-mlm@<start>-<config>``): fine-tune one
configuration, as its resolved settings file says, and write its metrics file and
record, history, PCGrad log, predictions and model."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from minbert.atomic import atomic_directory
from minbert.data.batches import TokenizedTable
from minbert.model.bert import BertModel
from minbert.model.multitask import save_multitask
from minbert.pipeline import outputs
from minbert.pipeline.entry import stage_main
from minbert.pipeline.model_card import MODEL_CARD, dev_intervals, model_card
from minbert.pipeline.run_record import MultitaskRun
from minbert.pipeline.stage import started
from minbert.results import CONFLICTS, HISTORY, STEP_LOSSES, run_log
from minbert.runs.training import joined, write_run
from minbert.settings import MultitaskSettings, RunContext
from minbert.tasks import MULTITASK_TASKS, SPLITS
from minbert.train.head_warmup import ProbeFeatures
from minbert.train.multitask import CONFLICT_COLUMNS, STEP_LOSS_COLUMNS, train_multitask
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
        probe = (
            None
            if features is None or checkpoint is not None
            else ProbeFeatures(features, stage.checkpoint["sha256"], settings.pooling)
        )
        result = train_multitask(
            settings, encoder, tables, stage.device, resume=resume, world=stage.world, features=probe
        )
        run = MultitaskRun.of(context, settings, result, stage, manifest, checkpoint)
        if stage.world.is_main:
            _write(
                name,
                run,
                resolved["max_length"],
                result,
                tables,
                stage,
                Path(metrics),
                Path(predictions),
                models,
            )
            resume.clear()
        return joined(run.file())


def _write(name, run, max_length, result, tables, stage, metrics_dir, predictions_dir, models_dir) -> None:
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
        directory = Path(models_dir) / name
        card = model_card(name, run, dev_intervals(result, tables), directory.as_posix())
        with atomic_directory(directory) as written:
            info = run.model_info(name, max_length)
            save_multitask(result.model.to("cpu"), written, stage.checkpoint_dir / "vocab.txt", info)
            (written / MODEL_CARD).write_text(card, encoding="utf-8")
            # Which rows the model learned from, so that scoring it on them can be caught.
            ids = json.dumps({"tasks": result.training_ids}, sort_keys=True).encode("utf-8")
            (written / TRAINING_IDS).write_bytes(gzip.compress(ids, mtime=0))
    outputs.write_history(run_log(metrics_dir, name, HISTORY), [epoch.row() for epoch in result.history])
    outputs.write_conflicts(run_log(metrics_dir, name, CONFLICTS), result.conflicts, CONFLICT_COLUMNS)
    outputs.write_step_losses(run_log(metrics_dir, name, STEP_LOSSES), result.step_losses, STEP_LOSS_COLUMNS)
    write_run(run.file(), metrics_dir, name)


# ``--checkpoint``: an MLM stage's output to fine-tune from (stage multitask-mlm).
main = stage_main(
    run, "tokenized", "manifest", "metrics", "predictions", "models", optional=("checkpoint", "features")
)
