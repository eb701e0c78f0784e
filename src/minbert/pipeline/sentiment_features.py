"""Stage ``sentiment-features``: the frozen checkpoint's pooled vectors of the rows Table 1's
runs take (training, validation, dev, test), per task, encoded once: the last-layer arm
trains its head on them, the full arm scores its start (epoch 0: the untouched encoder
and a fresh head) from them, each as if it had encoded them itself, to the bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from minbert.atomic import atomic_directory
from minbert.data.batches import TokenizedTable
from minbert.data.validation_split import run_rows
from minbert.evaluate.sentiment import encode_pooled
from minbert.model.bert import BertModel
from minbert.pipeline.entry import stage_main
from minbert.pipeline.stage import started
from minbert.progress import console
from minbert.settings import RunContext, SentimentSettings

INDEX = "index.json"


def read_tables(tokenized: Path, task: str, test: bool) -> dict[str, TokenizedTable]:
    # The task's tokenised train and dev tables, and test where asked for and present.
    test = test and (tokenized / f"{task}-test.parquet").exists()
    splits = ("train", "dev", "test") if test else ("train", "dev")
    return {split: TokenizedTable.read(tokenized / f"{task}-{split}.parquet") for split in splits}


def run(resolved: dict, tokenized: Path, out: Path) -> dict:
    """Write ``<task>-<split>.npy`` (float32, a vector per row in the split's row order)
    and ``index.json`` (checkpoint, the settings they were made with, each file's ids)."""
    index: dict = {"tasks": {}}
    context = RunContext.of(resolved)
    with started(context, "sentiment-features") as stage, atomic_directory(Path(out)) as directory:
        encoder = BertModel.from_pretrained(stage.checkpoint_dir).to(stage.device)
        for task, values in resolved["tasks"].items():
            tables = read_tables(Path(tokenized), task, values["test_predictions"])
            train, validation = run_rows(
                tables["train"], values["validation_examples"], values["train_examples"], values["seed"]
            )
            files = {}
            scored = {split: table for split, table in tables.items() if split != "train"}
            for split, table in {"train": train, "validation": validation, **scored}.items():
                console.log(f"sentiment features: {task} {split}, {len(table)} rows")
                vectors = encode_pooled(
                    encoder, table, values["eval_batch_size"], stage.device, values["max_tokens"],
                    values["pooling"],
                )  # fmt: skip
                np.save(directory / f"{task}-{split}.npy", vectors.numpy().astype(np.float32))
                files[split] = list(table.ids)
            made_with = {k: v for k, v in values.items() if k != "test_predictions"}
            index["tasks"][task] = {"made_with": made_with, "files": files}
        index |= {"checkpoint": stage.checkpoint, "device": stage.device_name}
        (directory / INDEX).write_text(json.dumps(index) + "\n", encoding="utf-8")
    tasks = index["tasks"].items()
    return {task: {s: len(ids) for s, ids in entry["files"].items()} for task, entry in tasks}


def read(
    directory: Path, settings: SentimentSettings, checkpoint_sha256: str, tables: dict[str, TokenizedTable]
) -> dict[str, torch.Tensor]:
    """The vectors of ``tables`` (split -> the rows the run takes), refused unless they were
    made from the run's checkpoint, with its settings, of the same rows in the same order."""
    index = json.loads((Path(directory) / INDEX).read_text(encoding="utf-8"))
    entry = index["tasks"].get(settings.task)
    said = f"{Path(directory) / INDEX}: run `dvc repro sentiment-features`"
    if entry is None:
        raise ValueError(f"{said}: no vectors of {settings.task}")
    made_with = {k: getattr(settings, k) for k in entry["made_with"]}
    if index["checkpoint"]["sha256"] != checkpoint_sha256 or entry["made_with"] != made_with:
        raise ValueError(f"{said}: made with another checkpoint or other settings than the run's")
    vectors = {}
    for split, table in tables.items():
        if entry["files"].get(split) != list(table.ids):
            raise ValueError(f"{said}: its {settings.task} {split} rows are not the run's")
        vectors[split] = torch.from_numpy(np.load(Path(directory) / f"{settings.task}-{split}.npy"))
    return vectors


main = stage_main(run, "tokenized", "out")
