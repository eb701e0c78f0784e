"""Stage ``features``: the frozen checkpoint's pooled vectors of the training and
validation rows the runs take (every configuration of a seed takes the same) and of every
dev row, per task and layout, computed once for every configuration that starts from the
checkpoint. The head warm-up fits on the training rows' vectors; a run's start (epoch 0:
fitted heads on the untouched checkpoint) is scored from them without encoding again."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from minbert.atomic import atomic_directory
from minbert.data.batches import TokenizedTable
from minbert.data.multitask import TaskData
from minbert.data.validation_split import run_rows
from minbert.model.bert import BertModel
from minbert.pipeline.entry import stage_main
from minbert.pipeline.stage import started
from minbert.progress import console
from minbert.settings import RunContext
from minbert.tasks import TASKS
from minbert.train.head_warmup import FEATURE_SPLITS, ProbeFeatures, feature_file, frozen_vectors


def run(resolved: dict, tokenized: Path, out: Path) -> dict:
    """Write ``<task>-<split>-<layout>.npy`` (float32, a row per row taken: of training,
    those of the runs' validation and training rows, in file order) for every task the
    warm-up fits and ``index.json`` (checkpoint, pooling, each file's row
    ids) under ``out``; no task (no warm-up at this scale): the index alone."""
    files = {}
    with started(RunContext.of(resolved), "features") as stage, atomic_directory(Path(out)) as directory:
        encoder = BertModel.from_pretrained(stage.checkpoint_dir).to(stage.device)
        for task, split in ((t, s) for t in resolved["tasks"] for s in FEATURE_SPLITS):
            table = TokenizedTable.read(Path(tokenized) / f"{task}-{split}.parquet")
            if split == "train":  # the rows the runs take, not the whole split
                taken = run_rows(
                    table,
                    resolved["validation_examples"][task],
                    resolved["train_examples"][task],
                    resolved["seed"],
                )
                ids = {i for part in taken for i in part.ids}
                table = table.subset(
                    np.array([k for k, i in enumerate(table.ids) if i in ids], dtype=np.int64)
                )
            for siamese in (False, True) if TASKS[task].is_pair else (False,):
                data = TaskData(task, table, siamese)
                name = feature_file(task, split, siamese)
                console.log(f"features: {name}, {len(data)} rows")
                vectors = frozen_vectors(
                    encoder, resolved["pooling"], data, resolved["eval_batch_size"], stage.device
                )
                np.save(directory / f"{name}.npy", vectors.cpu().numpy().astype(np.float32))
                files[name] = {"rows": len(data), "ids": list(table.ids)}
        index = {
            "checkpoint": stage.checkpoint,
            "pooling": resolved["pooling"],
            "device": stage.device_name,
            "files": files,
        }
        (directory / ProbeFeatures.INDEX).write_text(json.dumps(index) + "\n", encoding="utf-8")
    return {name: entry["rows"] for name, entry in files.items()}


main = stage_main(run, "tokenized", "out")
