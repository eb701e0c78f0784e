"""params.yaml: the committed file is valid, and mistakes are named before work starts."""

import copy

import pytest
import yaml
from conftest import REPO

from minbert import params


@pytest.fixture
def committed():
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_committed_params_are_valid(committed):
    params.validate(committed)
    for run in committed["sentiment"]["runs"]:
        settings = params.sentiment_settings(committed, run)
        assert settings.seed == committed["seed"]


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["optimiser"], "adamaxw", "unknown key 'optimiser'"),
        (["sentiment", "optimizer"], "sgd", r"sentiment.optimizer = 'sgd' is not one of \['adamw', 'adamaxw'\]"),
        (["sentiment", "runs", "sst-full", "mode"], "lora", "sentiment.runs.sst-full.mode = 'lora'"),
        (["device"], "tpu", "device = 'tpu' is not one of"),
        (["scale"], "huge", r"scale = 'huge' is not one of \['cpu', 'paper'\]"),
        (["seed"], "11711", "seed must be int"),
        (["scales", "cpu", "sentiment", "batch_size"], True, "batch_size must be int"),
        (["data", "quora_holdout_fraction"], 1.5, "strictly between 0 and 1"),
        (["scales", "cpu", "max_length", "imdb"], 10, "unknown key 'scales.cpu.max_length.imdb'"),
        (["mlm", "pretrain"], ["continue", "warm"], r"mlm.pretrain\[1\] = 'warm' is not one of"),
        (["mlm", "pretrain"], "continue", "mlm.pretrain must be a list"),
        (["mlm", "pretrain"], ["scratch", "scratch"], "mlm.pretrain lists an entry twice"),
        (["mlm", "finetune"], ["baseline", "bestest"], r"mlm.finetune names \['bestest'\]"),
        (["mlm", "sources"], ["sst", "imdb"], r"mlm.sources\[1\] = 'imdb'"),
        (["mlm", "mask_prob"], 1.0, "mlm.mask_prob must lie strictly between 0 and 1"),
    ],
)
def test_mistakes_are_named(committed, path, value, message):
    bad = copy.deepcopy(committed)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(params.ParamsError, match=message):
        params.validate(bad)


def test_missing_key_is_named(committed):
    del committed["sentiment"]["dropout"]
    with pytest.raises(params.ParamsError, match="sentiment lacks dropout"):
        params.validate(committed)


def test_scale_switch_changes_sizes(committed):
    cpu = params.sentiment_settings(committed, "sst-full")
    committed["scale"] = "paper"
    paper = params.sentiment_settings(committed, "sst-full")
    assert (paper.batch_size, paper.epochs) == (8, 10)
    assert paper.lr == cpu.lr == 1e-5


def test_mlm_settings_per_start(committed):
    cont, scratch = params.mlm_settings(committed, "continue"), params.mlm_settings(committed, "scratch")
    assert cont.lr == committed["mlm"]["starts"]["continue"]["lr"] and cont.scratch_config == {}
    assert scratch.scratch_config["num_hidden_layers"] == committed["mlm"]["starts"]["scratch"]["num_hidden_layers"]
    assert cont.max_length == committed["scales"]["cpu"]["mlm"]["max_length"]
    with pytest.raises(params.ParamsError, match="MLM start 'warm'"):
        params.mlm_settings(committed, "warm")
