"""Stage ``zero-shot``: the untrained checkpoint on the full multitask dev sets, the row
fine-tuning starts from (how it is scored: ``minbert.evaluate.zero_shot``)."""

from __future__ import annotations

import json
from pathlib import Path

from minbert.data.batches import TokenizedTable
from minbert.device import choose_device, describe, pin_cpu_kernels
from minbert.errors import reported
from minbert.evaluate.zero_shot import zero_shot
from minbert.metrics import AVERAGE, METRIC, MULTITASK_TASKS, fixed
from minbert.model.bert import BertModel
from minbert.model.checkpoint import describe_checkpoint, resolve_checkpoint
from minbert.pipeline import outputs
from minbert.results import write_result


def run(
    resolved: dict, tokenized_dir: Path, manifest_file: Path, metrics_file: Path, predictions_dir: Path
) -> dict:
    """Score the untrained checkpoint; write its metrics file (``metrics_file``), its record
    beside it (``minbert.results``) and its dev predictions."""
    pin_cpu_kernels()
    tokenized_dir, predictions_dir = Path(tokenized_dir), Path(predictions_dir)
    checkpoint_dir = resolve_checkpoint(resolved["checkpoint"])
    device = choose_device(resolved["device"])
    tables = {
        (t, s): TokenizedTable.read(tokenized_dir / f"{t}-{s}.parquet")
        for t in MULTITASK_TASKS
        for s in ("train", "dev")
    }
    pooling = resolved["pooling"]
    result = zero_shot(
        BertModel.from_pretrained(checkpoint_dir),
        tables,
        pooling=pooling,
        quora_train_pairs=resolved["quora_train_pairs"],
        batch_size=resolved["eval_batch_size"],
        device=device,
        seed=resolved["seed"],
    )
    for task in MULTITASK_TASKS:
        outputs.write_predictions(
            predictions_dir / f"{task}-dev-out.csv", task, tables[task, "dev"].ids, result.predictions[task]
        )
    manifest = json.loads(Path(manifest_file).read_text(encoding="utf-8"))
    numbers = {
        **{t: fixed(result.scores[METRIC[t]]) for t in MULTITASK_TASKS},
        AVERAGE: fixed(result.scores[AVERAGE]),
    }
    record = {
        "config": "zero-shot",
        "dev_examples": {t: len(tables[t, "dev"]) for t in MULTITASK_TASKS},
        "method": {
            "sst": f"majority class of the training labels (class {result.sst_majority_class})",
            "quora": f"cosine of the pooled sentence vectors above {result.quora_threshold:.4f}, the "
            f"most accurate threshold on {result.quora_threshold_pairs} training pairs",
            "sts": "cosine of the pooled sentence vectors, mapped onto 0-5",
        },
        "pooling": pooling,
        "data_split": {
            "sst": "course train / dev",
            "sts": "course train / dev",
            "quora": manifest["quora_split"],
        },
        "checkpoint": describe_checkpoint(resolved["checkpoint"], checkpoint_dir),
        "scale": resolved["scale"],
        "seed": resolved["seed"],
        "device": describe(device),
    }
    metrics_file = Path(metrics_file)
    write_result(metrics_file.parent, metrics_file.stem, numbers, record)
    return {**record, **numbers}


@reported
def main(
    settings_file: Path, tokenized_dir: Path, manifest_file: Path, metrics_file: Path, predictions_dir: Path
) -> dict:
    return run(
        outputs.read_settings(settings_file), tokenized_dir, manifest_file, metrics_file, predictions_dir
    )
