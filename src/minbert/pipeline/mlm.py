"""Stage ``mlm@<start>``: masked-language-model pretraining (``continue`` | ``scratch``),
written as a checkpoint directory that the fine-tuning stages read like any other."""

from __future__ import annotations

import shutil
from pathlib import Path

from minbert.atomic import atomic_directory
from minbert.data.corpus import build_corpus
from minbert.data.masking import Vocabulary
from minbert.model.checkpoint import TRAINING_DATA_FILE
from minbert.pipeline import outputs
from minbert.pipeline.entry import stage_main
from minbert.pipeline.stage import started
from minbert.results import HISTORY, run_log
from minbert.runs.record_parts import Checkpoint, MaskedScores, MlmCorpus
from minbert.runs.training import MlmRunFile, write_run
from minbert.settings import MlmSettings, RunContext
from minbert.train.mlm import build_model, train_mlm
from minbert.train.resume import DEFAULT_DIRECTORY as RESUME_DIRECTORY


def run(
    resolved: dict,
    tokenized: Path,
    models: Path,
    metrics: Path,
    resume_dir: Path | None = RESUME_DIRECTORY,
) -> dict:
    """Pretrain (``resolved``: ``minbert.pipeline.params.resolve_mlm``) on the tokenised
    training tables and write a checkpoint directory (``models/<start>/``), its metrics
    file and record (``minbert.results``, under ``metrics``). Training state is saved to
    ``resume_dir`` after every epoch; a rerun after an interruption resumes."""
    tokenized_dir, out_dir, metrics_dir = map(Path, (tokenized, models, metrics))
    context, settings = RunContext.of(resolved, "start"), MlmSettings.from_dict(resolved["settings"])
    start = context.name
    with started(context, "mlm") as stage:
        checkpoint_dir = stage.checkpoint_dir
        vocab = Vocabulary.read(checkpoint_dir / "vocab.txt")
        corpus = build_corpus(
            tokenized_dir, settings.sources, settings.max_length, cls_id=vocab.cls_id, sep_id=vocab.sep_id
        )
        model = build_model(settings, checkpoint_dir)
        resume = stage.resume_point(
            resume_dir, f"mlm-{start}", settings, corpus=[len(corpus), int(corpus.input_ids.lengths().sum())]
        )
        result = train_mlm(settings, model, corpus, vocab, stage.device, resume=resume)

    source = stage.checkpoint
    provenance = {"mlm_start": start, "mlm_base_checkpoint": source["name"] if start == "continue" else None}
    with atomic_directory(out_dir / start) as tmp:
        model.to("cpu").save_pretrained(tmp, checkpoint_dir / "vocab.txt", extra_config=provenance)
        # A continued checkpoint keeps the record of what its base was trained on.
        if start == "continue" and (checkpoint_dir / TRAINING_DATA_FILE).is_file():
            shutil.copyfile(checkpoint_dir / TRAINING_DATA_FILE, tmp / TRAINING_DATA_FILE)
    file = MlmRunFile(
        start=start,
        accuracy=result.after["masked_accuracy"],
        steps=result.optimizer_steps,
        base_checkpoint=Checkpoint.from_dict(source) if start == "continue" else None,
        head=model.head_report,
        model=model.config.to_json_dict() if start == "scratch" else None,
        # Held-out masked-token accuracy, perplexity and loss before and after pretraining,
        # on the same masked positions (the accuracy after it: the metrics file's).
        before=MaskedScores(**result.before),
        after=MaskedScores(**{k: v for k, v in result.after.items() if k != "masked_accuracy"}),
        corpus=MlmCorpus(**result.corpus),
        settings=settings,
        scale=context.scale,
        seed=settings.seed,
        device=stage.device_name,
    )
    outputs.write_history(run_log(metrics_dir, start, HISTORY), result.history)
    written = write_run(file, metrics_dir, start)
    resume.clear()
    return written


main = stage_main(run, "tokenized", "models", "metrics")
