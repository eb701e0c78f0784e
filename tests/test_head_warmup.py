# ruff: noqa: F811  (the fixtures imported from test_multitask are parameters here)
"""The head warm-up: heads fitted on the frozen checkpoint's pooled vectors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO
from test_multitask import run_in, tiny_params, tokenized  # noqa: F401  (fixtures)

from minbert.data.batches import TokenizedTable
from minbert.data.multitask import TaskData
from minbert.model.bert import BertModel
from minbert.model.multitask import MultitaskBert, task_loss
from minbert.pipeline import params as params_module
from minbert.pipeline.schema import validate
from minbert.settings import HeadWarmup
from minbert.tasks import MULTITASK_TASKS
from minbert.train.head_warmup import pooled_vectors, warm_up_heads


def _settings(warmup: HeadWarmup, weight_decay: float, seed: int, eval_batch_size: int = 128):
    """The committed baseline's settings with this warm-up, weight decay, seed and scoring batch."""
    committed = validate(yaml.safe_load((REPO / "params.yaml").read_text()))
    base = params_module.multitask_settings(committed, "baseline")
    return dataclasses.replace(
        base, head_warmup=warmup, weight_decay=weight_decay, seed=seed, eval_batch_size=eval_batch_size
    )


def _model_and_data(tokenized, checkpoint, paraphrase_head="siamese-concat-diff", sts_head="siamese-cosine"):
    torch.manual_seed(0)
    model = MultitaskBert(BertModel.from_pretrained(checkpoint), paraphrase_head, sts_head, 0.1, "mean")
    data = {
        t: TaskData(t, TokenizedTable.read(tokenized / "tok" / f"{t}-train.parquet"), model.is_siamese(t))
        for t in MULTITASK_TASKS
    }
    return model, data


def _features_stage(checkpoint, tokenized, out, train_examples=0, validation_examples=4, seed=0) -> dict:
    """The `features` stage on the tiny tables and checkpoint (scoring batches of 7); the
    runs' rows: every training row by default."""
    from minbert.pipeline.features import run

    resolved = {
        "checkpoint": str(checkpoint),
        "device": "cpu",
        "scale": "cpu",
        "pooling": "mean",
        "eval_batch_size": 7,
        "tasks": list(MULTITASK_TASKS),
        "seed": seed,
        "train_examples": dict.fromkeys(MULTITASK_TASKS, train_examples),
        "validation_examples": dict.fromkeys(MULTITASK_TASKS, validation_examples),
    }
    return run(resolved, tokenized / "tok", out)


def _probe(directory: Path, checkpoint: Path):
    """The features under ``directory`` opened for the tiny checkpoint, mean-pooled."""
    from minbert.model.checkpoint import describe_checkpoint
    from minbert.train.head_warmup import ProbeFeatures

    return ProbeFeatures(directory, describe_checkpoint("tiny", checkpoint)["sha256"], "mean")


def test_pooled_vectors_match_the_model_in_row_order(tokenized, tiny_checkpoint):
    model, data = _model_and_data(tokenized, tiny_checkpoint)
    model.eval()
    for task in ("sst", "quora"):
        vectors = pooled_vectors(model, task, data[task], 5, torch.device("cpu"))
        rows = np.array([3, 0, 7])
        with torch.no_grad():
            direct = model.pooled(data[task].batch(rows))
        if model.is_siamese(task):
            direct = torch.stack(direct.chunk(2), dim=1)
        torch.testing.assert_close(vectors[rows], direct, atol=1e-5, rtol=1e-5)


def test_warm_up_fits_the_heads_and_leaves_encoder_and_random_state_alone(tokenized, tiny_checkpoint):
    model, data = _model_and_data(tokenized, tiny_checkpoint)
    encoder = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    heads = {k: v.clone() for k, v in model.heads.state_dict().items()}
    state = torch.get_rng_state()
    settings = _settings(
        HeadWarmup(epochs=30, lr=1e-2, batch_size=6), weight_decay=0.01, seed=3, eval_batch_size=7
    )
    # validation = training rows: the fit must lower this loss
    report = warm_up_heads(model, data, data, settings, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(v, encoder[k]) for k, v in model.encoder.state_dict().items())
    # The cosine head has no parameters: nothing to fit.
    assert set(report) == {"sst", "quora"}
    for task in ("sst", "quora"):
        assert report[task]["epochs_kept"] > 0 and report[task]["rows"] == len(data[task])
        assert report[task]["validation_loss_after"] < report[task]["validation_loss_before"]
        moved = [
            not torch.equal(v, heads[k]) for k, v in model.heads.state_dict().items() if k.startswith(task)
        ]
        assert all(moved)
        # The kept heads give the reported loss.
        model.eval()
        with torch.no_grad():
            output = model(task, data[task].batch(np.arange(len(data[task]))))
        loss = task_loss(task, output, data[task].labels(np.arange(len(data[task])))).item()
        assert loss == pytest.approx(report[task]["validation_loss_after"], abs=1e-3)
    # Seeded: the same call fits the same heads.
    again, _ = _model_and_data(tokenized, tiny_checkpoint)
    warm_up_heads(again, data, data, settings, torch.device("cpu"))
    assert all(torch.equal(v, again.heads.state_dict()[k]) for k, v in model.heads.state_dict().items())


def test_no_warm_up_changes_nothing(tokenized, tiny_checkpoint):
    model, data = _model_and_data(tokenized, tiny_checkpoint)
    heads = {k: v.clone() for k, v in model.heads.state_dict().items()}
    settings = _settings(HeadWarmup(0), weight_decay=0.01, seed=0)
    assert warm_up_heads(model, data, data, settings, torch.device("cpu")) == {}
    assert all(torch.equal(v, heads[k]) for k, v in model.heads.state_dict().items())


@pytest.mark.slow
def test_a_stage_with_warm_up_records_it_and_starts_epoch_0_from_fitted_heads(
    tmp_path, tokenized, tiny_params
):
    """Epoch 0 (no encoder update yet) scores the fitted heads: its validation losses are
    the warm-up's, and the metrics file records the warm-up per task."""
    import pandas as pd

    tiny_params["scales"]["cpu"]["multitask"]["head_warmup"] = {
        "epochs": 20,
        "lr": 1e-2,
        "batch_size": 8,
        "tasks": ["sst", "quora", "sts"],
    }
    metrics = run_in(tmp_path, validate(tiny_params), "siamese-diff", tokenized)
    warmup = metrics["head_warmup"]
    assert set(warmup) == set(MULTITASK_TASKS)
    history = pd.read_csv(tmp_path / "metrics" / "siamese-diff-history.csv")
    for task in MULTITASK_TASKS:
        assert history.loc[0, f"val_loss_{task}"] == pytest.approx(
            warmup[task]["validation_loss_after"], abs=1e-3
        )


def test_only_the_named_tasks_heads_are_fitted(tokenized, tiny_checkpoint):
    model, data = _model_and_data(tokenized, tiny_checkpoint, sts_head="siamese-concat")
    heads = {k: v.clone() for k, v in model.heads.state_dict().items()}
    settings = _settings(HeadWarmup(10, 1e-2, ("sst",)), weight_decay=0.0, seed=0)
    report = warm_up_heads(model, data, data, settings, torch.device("cpu"))
    assert set(report) == {"sst"}
    for k, v in model.heads.state_dict().items():
        assert torch.equal(v, heads[k]) == (not k.startswith("sst")), k


def test_the_features_stage_gives_the_vectors_the_warm_up_would_compute(tokenized, tiny_checkpoint, tmp_path):
    """The `features` stage computes the frozen checkpoint's vectors once; a warm-up that
    reads them fits the same heads as one that computes them, from any subset of rows."""
    written = _features_stage(tiny_checkpoint, tokenized, tmp_path / "features")
    layouts = ("sst-{}-sentence", "quora-{}-cross", "quora-{}-siamese", "sts-{}-cross", "sts-{}-siamese")
    assert set(written) == {name.format(split) for name in layouts for split in ("train", "dev")}
    features = _probe(tmp_path / "features", tiny_checkpoint)
    fitted = []
    for given in (None, features):
        model, data = _model_and_data(tokenized, tiny_checkpoint, "cross-encoder", "siamese-concat")
        part = {t: TaskData(t, d.table.subset(np.arange(1, len(d), 2)), d.siamese) for t, d in data.items()}
        cpu = torch.device("cpu")
        for task, d in part.items():
            torch.testing.assert_close(
                features.vectors(d, d.table.ids, cpu),
                pooled_vectors(model, task, d, 5, cpu),
                atol=1e-5,
                rtol=1e-5,
            )
        settings = _settings(HeadWarmup(5, 1e-2, batch_size=4), weight_decay=0.0, seed=1)
        warm_up_heads(model, part, data, settings, cpu, features=given)
        fitted.append(model.heads.state_dict())
    for k, v in fitted[0].items():
        torch.testing.assert_close(v, fitted[1][k], atol=1e-5, rtol=1e-4)
    with pytest.raises(KeyError, match="no vector for ids"):
        features.vectors(part["sst"], ["not-an-id"], torch.device("cpu"))


def test_features_of_another_checkpoint_or_pooling_are_refused(tokenized, tiny_checkpoint, tmp_path):
    """Every reader opens the features for its own checkpoint and pooling: vectors made
    with another checkpoint (its weights' sha256) or pooling are refused, never read."""
    from minbert.model.checkpoint import describe_checkpoint
    from minbert.train.head_warmup import ProbeFeatures

    _features_stage(tiny_checkpoint, tokenized, tmp_path / "features")
    sha = describe_checkpoint("tiny", tiny_checkpoint)["sha256"]
    assert ProbeFeatures(tmp_path / "features", sha, "mean").index["pooling"] == "mean"
    for other in ((sha[::-1], "mean"), (sha, "cls")):
        with pytest.raises(ValueError, match="another checkpoint or pooling"):
            ProbeFeatures(tmp_path / "features", *other)


def test_the_start_scored_from_the_features_is_the_start_scored_by_encoding(
    tokenized, tiny_checkpoint, tmp_path
):
    """A run's start (fitted heads on the untouched checkpoint) is scored on dev from the
    features stage's vectors: the same scores and predictions as encoding every dev row
    again, for cross-encoder and siamese heads alike."""
    from minbert.evaluate.multitask import evaluate_multitask

    _features_stage(tiny_checkpoint, tokenized, tmp_path / "features")
    features = _probe(tmp_path / "features", tiny_checkpoint)
    cpu = torch.device("cpu")
    for heads in (("cross-encoder", "cross-encoder"), ("siamese-concat-diff", "siamese-cosine")):
        model, _ = _model_and_data(tokenized, tiny_checkpoint, *heads)
        dev = {
            t: TaskData(t, TokenizedTable.read(tokenized / "tok" / f"{t}-dev.parquet"), model.is_siamese(t))
            for t in MULTITASK_TASKS
        }
        assert all(features.covers(d, "dev") for d in dev.values())
        assert not features.covers(dev["sst"], "train")  # dev rows are not training rows
        vectors = {t: features.vectors(d, d.table.ids, cpu, "dev") for t, d in dev.items()}
        encoded, encoded_predictions = evaluate_multitask(model, dev, 5, cpu)
        read, read_predictions = evaluate_multitask(model, dev, 5, cpu, vectors=vectors)
        assert read.keys() == encoded.keys()
        for key, value in encoded.items():
            assert read[key] == pytest.approx(value, abs=1e-5), (heads, key)
        for task in ("sst", "quora"):
            np.testing.assert_array_equal(read_predictions[task], encoded_predictions[task])
        np.testing.assert_allclose(read_predictions["sts"], encoded_predictions["sts"], atol=1e-4)


def test_the_features_stage_takes_the_runs_rows_and_other_rows_are_encoded(
    tokenized, tiny_checkpoint, tmp_path
):
    """The `features` stage encodes the training and validation rows the runs of its seed
    take (every configuration takes the same), not the whole split; a warm-up of other
    rows (another seed) encodes them itself and fits what encoding every row fits."""
    from minbert.data.validation_split import run_rows
    from minbert.train.head_warmup import feature_file

    _features_stage(tiny_checkpoint, tokenized, tmp_path / "features", train_examples=6, seed=3)
    features = _probe(tmp_path / "features", tiny_checkpoint)
    others = {}
    for task in MULTITASK_TASKS:
        table = TokenizedTable.read(tokenized / "tok" / f"{task}-train.parquet")
        train, validation = run_rows(table, 4, 6, 3)
        taken = features.index["files"][feature_file(task, "train", False)]["ids"]
        assert sorted(taken) == sorted([*train.ids, *validation.ids]) and len(taken) < len(table)
        assert features.covers(TaskData(task, train, False), "train")
        others[task] = run_rows(table, 4, 6, 4)  # another seed's
    assert not all(features.covers(TaskData(t, train, False), "train") for t, (train, _) in others.items())
    cpu, fitted = torch.device("cpu"), []
    for given in (None, features):
        model, _ = _model_and_data(tokenized, tiny_checkpoint, "cross-encoder", "cross-encoder")
        train = {t: TaskData(t, rows[0], False) for t, rows in others.items()}
        validation = {t: TaskData(t, rows[1], False) for t, rows in others.items()}
        warm_up_heads(
            model, train, validation, _settings(HeadWarmup(3, 1e-2, batch_size=4), 0.0, 1), cpu, given
        )
        fitted.append(model.heads.state_dict())
    for k, v in fitted[0].items():
        torch.testing.assert_close(v, fitted[1][k], atol=1e-5, rtol=1e-4)
