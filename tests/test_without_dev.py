# ruff: noqa: F811  (the fixtures imported from test_multitask are parameters here)
"""A run that scores no dev (``train_multitask(score_dev=False)``, what the benchmarks'
searches train with) never reads a dev table and still chooses its epoch on validation."""

from __future__ import annotations

import torch
from test_multitask import tiny_params, tokenized  # noqa: F401  (fixtures)

from minbert.model.bert import BertModel
from minbert.pipeline.multitask import load_tables
from minbert.pipeline.params import multitask_settings
from minbert.tasks import SELECTION
from minbert.train.multitask import train_multitask


def test_a_run_that_scores_no_dev_reads_only_the_training_tables(tmp_path, tokenized, tiny_params):
    train_only = tmp_path / "tok"
    train_only.mkdir()
    for path in (tokenized / "tok").glob("*-train.parquet"):  # no dev table: none can be read
        (train_only / path.name).symlink_to(path)
    tables = load_tables(train_only)
    assert {split for _, split in tables} == {"train"}
    settings = multitask_settings(tiny_params, "best-no-smart")
    encoder = BertModel.from_pretrained(tiny_params["checkpoint"])
    result = train_multitask(settings, encoder, tables, torch.device("cpu"), score_dev=False)
    scores = [epoch.validation[SELECTION] for epoch in result.history]
    assert len(scores) == settings.epochs + 1  # epoch 0 included
    assert all(-1 <= s <= 1 for s in scores)
    assert scores[result.best_epoch] == max(scores)  # the stage's own choice
