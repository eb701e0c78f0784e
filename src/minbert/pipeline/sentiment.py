"""Stage ``sentiment@<run>``: single-task sentiment training and evaluation (Table 1),
from the run's resolved settings (``data/settings/sentiment/<run>.json``)."""

from __future__ import annotations

from pathlib import Path

from minbert.data.validation_split import run_rows
from minbert.metrics import fixed, mcc
from minbert.model.bert import BertModel
from minbert.pipeline import outputs, sentiment_features
from minbert.pipeline.entry import stage_main
from minbert.pipeline.stage import started
from minbert.results import HISTORY, run_log
from minbert.runs.record_parts import Checkpoint
from minbert.runs.training import SentimentRunFile, write_run
from minbert.settings import RunContext, SentimentSettings
from minbert.train.resume import DEFAULT_DIRECTORY as RESUME_DIRECTORY
from minbert.train.sentiment import train_sentiment


def run(
    resolved: dict,
    tokenized: Path,
    features: Path,
    metrics: Path,
    predictions: Path,
    resume_dir: Path | None = RESUME_DIRECTORY,
) -> dict:
    """Train one run (``resolved``: its settings file's content) and write its metrics file,
    record, history and predictions; ``features``: the sentiment-features stage's frozen
    vectors. The training state is saved to ``resume_dir`` after every epoch, and a rerun
    continues from it."""
    tokenized_dir, metrics_dir, predictions_dir = map(Path, (tokenized, metrics, predictions))
    context, settings = RunContext.of(resolved, "run"), SentimentSettings.from_dict(resolved["settings"])
    run = context.name
    with started(context, "sentiment") as stage:
        tables = sentiment_features.read_tables(tokenized_dir, settings.task, settings.test_predictions)
        train, validation = run_rows(
            tables["train"], settings.validation_examples, settings.train_examples, settings.seed
        )
        # The frozen encoder's vectors: all a last-layer run encodes; the splits a full
        # fine-tuning run scores before its first step.
        splits = {"validation": validation, "dev": tables["dev"]}
        if settings.mode == "last-layer":
            splits |= {"train": train, **({"test": tables["test"]} if "test" in tables else {})}
        pooled = sentiment_features.read(features, settings, stage.checkpoint["sha256"], splits)
        encoder = BertModel.from_pretrained(stage.checkpoint_dir)
        resume = stage.resume_point(
            resume_dir, f"sentiment-{run}", settings, data={k: len(v) for k, v in tables.items()}
        )
        result = train_sentiment(
            settings,
            encoder,
            tables["train"],
            tables["dev"],
            tables.get("test"),
            stage.device,
            resume=resume,
            pooled=pooled,
        )
    file = SentimentRunFile(
        run=run,
        task=settings.task,
        mode=settings.mode,
        accuracy=fixed(result.dev_accuracy),
        epoch=result.best_epoch,
        steps=result.optimizer_steps,
        epochs=settings.epochs,
        # Epochs run (fewer when validation stopped improving) and the kept epoch's
        # accuracy on its own training rows (as trained, dropout on): what it learned.
        epochs_run=len(result.history) - 1,
        train_accuracy=result.history[result.best_epoch]["train_accuracy"],
        selection="the epoch (0, the start, or later) with the best MCC (chance-corrected: a "
        "constant answer scores 0) on the validation split, set aside from the training rows "
        "(never trained on); dev is scored with that epoch",
        # The chosen epoch's chance-corrected score on dev, and its training budget.
        dev_mcc=fixed(mcc(tables["dev"].labels, result.dev_predictions)),
        examples_seen=result.examples_seen,
        lr=settings.lr,
        head_lr=settings.lr if settings.head_lr is None else settings.head_lr,
        batch_size=settings.batch_size,
        optimizer=settings.optimizer,
        pooling=settings.pooling,
        train_examples=result.train_examples,
        validation_examples=result.validation_examples,
        dev_examples=len(tables["dev"]),
        data_split=f"course {settings.task} train / dev",
        checkpoint=Checkpoint.from_dict(stage.checkpoint),
        scale=context.scale,
        seed=settings.seed,
        device=stage.device_name,
    )
    outputs.write_predictions(
        predictions_dir / run / "dev-out.csv",
        settings.task,
        tables["dev"].ids,
        result.dev_predictions.tolist(),
    )
    if "test" in tables:
        outputs.write_predictions(
            predictions_dir / run / "test-out.csv",
            settings.task,
            tables["test"].ids,
            result.test_predictions.tolist(),
        )
    outputs.write_history(run_log(metrics_dir, run, HISTORY), result.history)
    written = write_run(file, metrics_dir, run)
    resume.clear()
    return written


main = stage_main(run, "tokenized", "features", "metrics", "predictions")
