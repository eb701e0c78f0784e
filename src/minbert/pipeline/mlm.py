"""Stage ``mlm@<start>``: masked-language-model pretraining (``continue`` | ``scratch``),
written as a checkpoint directory that the fine-tuning stages read like any other."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

from minbert.atomic import atomic_directory
from minbert.data.corpus import build_corpus
from minbert.data.masking import Vocabulary
from minbert.device import choose_device, describe, pin_cpu_kernels
from minbert.distributed import require_single_process
from minbert.errors import reported
from minbert.model.checkpoint import TRAINING_DATA_FILE, describe_checkpoint, resolve_checkpoint
from minbert.pipeline import outputs
from minbert.results import ACCURACY, STEPS, write_result
from minbert.train.mlm import MlmSettings, build_model, train_mlm


def run(resolved: dict, tokenized_dir: Path, out_dir: Path, metrics_dir: Path) -> dict:
    """Pretrain (``resolved``: ``minbert.pipeline.settings.resolve_mlm``) and write a
    checkpoint directory, its metrics file and record (``minbert.results``)."""
    require_single_process("mlm")
    pin_cpu_kernels()
    tokenized_dir, out_dir, metrics_dir = map(Path, (tokenized_dir, out_dir, metrics_dir))
    start, settings = resolved["start"], MlmSettings.from_dict(resolved["settings"])
    device = choose_device(resolved["device"])
    checkpoint_dir = resolve_checkpoint(resolved["checkpoint"])
    vocab = Vocabulary.read(checkpoint_dir / "vocab.txt")
    corpus = build_corpus(
        tokenized_dir, settings.sources, settings.max_length, cls_id=vocab.cls_id, sep_id=vocab.sep_id
    )
    model = build_model(settings, checkpoint_dir)
    result = train_mlm(settings, model, corpus, vocab, device)

    source = describe_checkpoint(resolved["checkpoint"], checkpoint_dir)
    provenance = {"mlm_start": start, "mlm_base_checkpoint": source["name"] if start == "continue" else None}
    with atomic_directory(out_dir / start) as tmp:
        model.to("cpu").save_pretrained(tmp, checkpoint_dir / "vocab.txt", extra_config=provenance)
        # A continued checkpoint keeps the record of what its base was trained on.
        if start == "continue" and (checkpoint_dir / TRAINING_DATA_FILE).is_file():
            shutil.copyfile(checkpoint_dir / TRAINING_DATA_FILE, tmp / TRAINING_DATA_FILE)
    numbers = {
        ACCURACY: result.after["masked_accuracy"],
        STEPS: result.optimizer_steps,
    }
    record = {
        "start": start,
        "base_checkpoint": source if start == "continue" else None,
        "head": model.head_report,
        "model": model.config.to_json_dict() if start == "scratch" else None,
        # Held-out masked-token accuracy, perplexity and loss before and after pretraining,
        # on the same masked positions (the accuracy after it: the metrics file's).
        "before": result.before,
        "after": {k: v for k, v in result.after.items() if k != "masked_accuracy"},
        "corpus": result.corpus,
        "settings": {k: v for k, v in asdict(settings).items() if k != "seed"},
        "scale": resolved["scale"],
        "seed": settings.seed,
        "device": describe(device),
    }
    outputs.write_history(metrics_dir / f"{start}-history.csv", result.history)
    write_result(metrics_dir, start, numbers, record)
    return {**record, **numbers}


@reported
def main(argv: list[str], settings_dir: Path, tokenized_dir: Path, out_dir: Path, metrics_dir: Path) -> dict:
    """The stage script's work: ``argv`` is ``<start>``."""
    return run(
        outputs.read_settings(Path(settings_dir) / f"{argv[0]}.json"), tokenized_dir, out_dir, metrics_dir
    )
