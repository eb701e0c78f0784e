"""Single-task sentiment training on tiny data with a tiny random encoder."""

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, tiny_sentiment_scale

from minbert.data.batches import TokenizedTable
from minbert.data.predictions import read_predictions
from minbert.data.tokenize import tokenize_prepared
from minbert.data.validation_split import run_rows
from minbert.evaluate.sentiment import logits_from_pooled, predict_logits
from minbert.model.bert import BertModel
from minbert.model.checkpoint import describe_checkpoint
from minbert.model.heads import SentimentClassifier
from minbert.pipeline import params as params_module
from minbert.pipeline import sentiment, sentiment_features
from minbert.pipeline.params import resolve_sentiment, resolve_sentiment_features
from minbert.pipeline.schema import validate
from minbert.results import read_result
from minbert.train.loop import NonFiniteLoss
from minbert.train.sentiment import train_sentiment

WORDS = ["good", "bad", "fine", "awful", "great", "dull", "film", "plot", "the", "a"]


def run_stage(params: dict, run: str, tokenized: Path, metrics: Path, *args, **kwargs) -> dict:
    """The stage with the settings the resolve stage would write, after the
    sentiment-features stage (for the run's task: the tiny tables hold no other)."""
    features = write_features(params, params["sentiment"]["runs"][run]["task"], tokenized, metrics)
    return sentiment.run(resolve_sentiment(params, run), tokenized, features, metrics, *args, **kwargs)


def write_features(params: dict, task: str, tokenized: Path, beside: Path) -> Path:
    resolved = resolve_sentiment_features(params)
    resolved["tasks"] = {task: resolved["tasks"][task]}
    out = Path(beside).with_name(Path(beside).name + "-features")
    sentiment_features.run(resolved, Path(tokenized), out)
    return out


def _table(n, seed, labelled=True):
    rng = np.random.default_rng(seed)
    rows = {
        "id": [f"id{seed}-{i}" for i in range(n)],
        "sentence": [" ".join(rng.choice(WORDS, size=rng.integers(2, 12))) for _ in range(n)],
    }
    if labelled:
        rows["label"] = rng.integers(0, 5, size=n)
    rows["line"] = np.arange(2, n + 2)
    return pd.DataFrame(rows)


@pytest.fixture
def tokenized(tmp_path, tiny_checkpoint):
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    _table(40, 0).to_parquet(prepared / "sst-train.parquet")
    _table(12, 1).to_parquet(prepared / "sst-dev.parquet")
    _table(7, 2, labelled=False).to_parquet(prepared / "sst-test.parquet")
    tokenize_prepared(prepared, tmp_path / "tok", tiny_checkpoint / "vocab.txt", {"sst": 32})
    return tmp_path / "tok"


@pytest.fixture
def tiny_params(tiny_checkpoint):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["checkpoint"] = str(tiny_checkpoint)
    p["device"] = "cpu"
    tiny_sentiment_scale(
        p, batch_size=8, epochs={"last-layer": 3, "full": 2}, train_examples={"sst": 32, "cfimdb": 0}
    )
    p["sentiment"]["eval_batch_size"] = 5
    return validate(p)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["sst-last-layer", "sst-full"])
def test_stage_writes_metrics_history_and_predictions(tmp_path, tokenized, tiny_params, run):
    metrics = run_stage(
        tiny_params, run, tokenized, tmp_path / "metrics", tmp_path / "pred", resume_dir=tmp_path / "resume"
    )
    saved = read_result(tmp_path / "metrics" / f"{run}.json")
    assert saved == metrics
    assert set(json.loads((tmp_path / "metrics" / f"{run}.json").read_text())) == {
        "accuracy",
        "epoch",
        "steps",
    }
    history = pd.read_csv(tmp_path / "metrics" / f"{run}-history.csv")
    assert history.epoch.tolist() == list(range(metrics["epochs"] + 1))  # epoch 0: before training
    assert np.isnan(history.train_loss[0])
    # Dev is scored at the start and with the kept epoch, never at the others.
    assert set(history.epoch[history.dev_accuracy.notna()]) == {0, metrics["epoch"]}
    # The epoch is chosen on the validation split (4 training rows set aside), never on
    # dev, by MCC: a head answering one class scores 0 there, whatever its accuracy; the
    # start (epoch 0) is a candidate, and a tie keeps the earlier epoch.
    best = history.loc[history.val_mcc.idxmax()]
    assert "best MCC" in metrics["selection"] and -1 <= metrics["dev_mcc"] <= 1
    assert metrics["examples_seen"] == metrics["train_examples"] * metrics["epochs"]
    assert metrics["epoch"] == best.epoch and metrics["accuracy"] == pytest.approx(best.dev_accuracy)
    assert metrics["train_examples"] == 32 and metrics["dev_examples"] == 12
    assert metrics["validation_examples"] == 4
    assert metrics["checkpoint"]["sha256"] and metrics["seed"] == tiny_params["seed"]
    dev = read_predictions(tmp_path / "pred" / run / "dev-out.csv")
    test = read_predictions(tmp_path / "pred" / run / "test-out.csv")
    assert len(dev) == 12 and len(test) == 7
    assert set(dev.values()) <= {"0", "1", "2", "3", "4"}
    # The dev predictions are those of the best epoch: they reproduce its accuracy.
    table = TokenizedTable.read(tokenized / "sst-dev.parquet")
    acc = np.mean([int(dev[i]) == y for i, y in zip(table.ids, table.labels)])
    assert round(acc, 4) == metrics["accuracy"]  # written at 4 decimals
    first_line = (tmp_path / "pred" / run / "dev-out.csv").read_text().splitlines()[0]
    assert first_line == "id \t Predicted_Sentiment "


@pytest.mark.slow
def test_same_seed_same_metrics(tmp_path, tokenized, tiny_params):
    a = run_stage(tiny_params, "sst-full", tokenized, tmp_path / "m1", tmp_path / "p1", tmp_path / "r1")
    b = run_stage(tiny_params, "sst-full", tokenized, tmp_path / "m2", tmp_path / "p2", tmp_path / "r2")
    assert (tmp_path / "m1" / "sst-full-history.csv").read_text() == (
        tmp_path / "m2" / "sst-full-history.csv"
    ).read_text()
    assert a == b


@pytest.mark.parametrize("run", ["sst-last-layer", "sst-full"])
def test_the_frozen_vectors_stage_changes_nothing_of_a_run(
    tmp_path, tokenized, tiny_params, tiny_checkpoint, run
):
    """A run given the sentiment-features stage's vectors (the last-layer arm's splits, the
    full arm's start) trains and scores as the run that encodes them itself, to the bit;
    vectors made with other settings are refused."""
    import dataclasses

    settings = params_module.sentiment_settings(tiny_params, run)
    tables = {s: TokenizedTable.read(tokenized / f"sst-{s}.parquet") for s in ("train", "dev", "test")}
    train, validation = run_rows(
        tables["train"], settings.validation_examples, settings.train_examples, settings.seed
    )
    splits = {"validation": validation, "dev": tables["dev"]}
    if settings.mode == "last-layer":
        splits |= {"train": train, "test": tables["test"]}
    features = write_features(tiny_params, "sst", tokenized, tmp_path / "m")
    sha = describe_checkpoint("tiny", tiny_checkpoint)["sha256"]
    pooled = sentiment_features.read(features, settings, sha, splits)

    def trained(pooled):
        encoder = BertModel.from_pretrained(tiny_checkpoint)
        args = (tables["train"], tables["dev"], tables["test"], torch.device("cpu"))
        return train_sentiment(settings, encoder, *args, pooled=pooled)

    a, b = trained(None), trained(pooled)
    assert a.history == b.history and a.best_epoch == b.best_epoch  # (at the history's precision)
    # To the bit: a fresh head on the vectors gives the logits the whole model gives.
    model = SentimentClassifier(BertModel.from_pretrained(tiny_checkpoint), 5, 0.3, settings.pooling)
    for split in ("validation", "dev"):
        args = (settings.eval_batch_size, torch.device("cpu"), settings.max_tokens)
        whole = predict_logits(model, splits[split], *args)
        assert torch.equal(logits_from_pooled(model, pooled[split], splits[split], *args), whole)
    assert np.array_equal(a.dev_predictions, b.dev_predictions)
    assert np.array_equal(a.test_predictions, b.test_predictions)
    for change in ({"eval_batch_size": 3}, {"seed": 1}):
        with pytest.raises(ValueError, match="other settings than the run's"):
            sentiment_features.read(features, dataclasses.replace(settings, **change), sha, splits)


def test_last_layer_leaves_encoder_untouched(tokenized, tiny_params, tiny_checkpoint):
    settings = params_module.sentiment_settings(tiny_params, "sst-last-layer")
    encoder = BertModel.from_pretrained(tiny_checkpoint)
    before = copy.deepcopy(encoder.state_dict())
    tables = {s: TokenizedTable.read(tokenized / f"sst-{s}.parquet") for s in ("train", "dev", "test")}
    train_sentiment(settings, encoder, tables["train"], tables["dev"], tables["test"], torch.device("cpu"))
    for k, v in encoder.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_non_finite_loss_names_step_and_examples(tokenized, tiny_params, tiny_checkpoint):
    settings = params_module.sentiment_settings(tiny_params, "sst-full")
    encoder = BertModel.from_pretrained(tiny_checkpoint)
    with torch.no_grad():
        encoder.embeddings.LayerNorm.bias.fill_(float("nan"))
    tables = {s: TokenizedTable.read(tokenized / f"sst-{s}.parquet") for s in ("train", "dev")}
    with pytest.raises(NonFiniteLoss, match=r"epoch 1, step 0, task sst; batch example ids: id0-"):
        train_sentiment(settings, encoder, tables["train"], tables["dev"], None, torch.device("cpu"))


@pytest.mark.slow
def test_token_budget_gives_the_same_training_in_pieces(tokenized, tiny_params, tiny_checkpoint):
    import dataclasses

    settings = dataclasses.replace(
        params_module.sentiment_settings(tiny_params, "sst-full"), dropout=0.0, lr=1e-3
    )
    tables = {s: TokenizedTable.read(tokenized / f"sst-{s}.parquet") for s in ("train", "dev")}

    def run(max_tokens):
        encoder = BertModel.from_pretrained(tiny_checkpoint)
        # No dropout anywhere: pieces draw different dropout masks than a whole batch.
        for module in encoder.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        for layer in encoder.encoder.layer:
            layer.attention.self.dropout_p = 0.0
        result = train_sentiment(
            dataclasses.replace(settings, max_tokens=max_tokens),
            encoder,
            tables["train"],
            tables["dev"],
            None,
            torch.device("cpu"),
        )
        return pd.DataFrame(result.history).drop(columns="lr").astype(float).to_numpy()

    whole, pieces = run(0), run(40)  # 40 tokens: batches of 8 split into several pieces
    assert np.allclose(whole, pieces, atol=1e-5, equal_nan=True)
