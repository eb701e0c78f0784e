"""What the tables' numbers are chosen on and what each configuration is given: the
validation split, the heads' learning rate, the carved Quora batch, equal-work ablations."""

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, TINY

from minbert.data.batches import Sequences, TokenizedTable
from minbert.data.multitask import epoch_steps
from minbert.data.validation_split import carve_validation
from minbert.model.bert import BertModel
from minbert.model.multitask import MultitaskBert
from minbert.pipeline import params as params
from minbert.pipeline.schema import ParamsError
from minbert.train.optim import build_optimizer, build_scheduler


@pytest.fixture
def committed():
    return yaml.safe_load((REPO / "params.yaml").read_text())


def table(n: int, groups=None) -> TokenizedTable:
    seqs = Sequences.from_list([np.array([101, 7 + i % 50, 102]) for i in range(n)])
    return TokenizedTable([f"id-{i:04d}" for i in range(n)], np.arange(n) % 2, {"input_ids": seqs}, groups)


def test_validation_rows_are_never_training_rows():
    pool, validation = carve_validation(table(100), 20, seed=3)
    assert len(validation) == 20 and len(pool) == 80
    assert not set(pool.ids) & set(validation.ids)
    assert sorted(pool.ids + validation.ids) == table(100).ids
    # Seeded by the ids alone: the same rows in any order give the same split.
    again = table(100).subset(np.arange(100)[::-1])
    assert set(carve_validation(again, 20, seed=3)[1].ids) == set(validation.ids)
    assert set(carve_validation(table(100), 20, seed=4)[1].ids) != set(validation.ids)


def test_validation_takes_whole_groups():
    groups = np.repeat(np.arange(25), 4)  # 25 groups of 4 rows
    pool, validation = carve_validation(table(100, groups), 10, seed=0)
    assert not set(pool.groups) & set(validation.groups)
    assert len(validation) == 12  # whole groups: at most one group more than asked
    with pytest.raises(ValueError, match="nothing would be left to train on"):
        carve_validation(table(10), 10, seed=0)


def test_validation_and_dev_are_disjoint_on_the_course_data(shared_data, tmp_path):
    """The prepared tables: every task's validation rows come from its training split,
    and no id (nor, for Quora, any question) is shared with its dev split."""
    import pandas as pd

    from minbert.data.prepare import prepare
    from minbert.data.quora_split import normalise_question

    committed = yaml.safe_load((REPO / "params.yaml").read_text())
    data = committed["data"]
    prepare(
        str(shared_data),
        tmp_path,
        quora_holdout_fraction=data["quora_holdout_fraction"],
        split_seed=data["split_seed"],
        skip_ids=data["skip_ids"],
    )
    sizes = committed["scales"]["cpu"]["multitask"]["validation_examples"]
    for task in ("sst", "quora", "sts"):
        train = pd.read_parquet(tmp_path / f"{task}-train.parquet")
        dev = pd.read_parquet(tmp_path / f"{task}-dev.parquet")
        groups = train["group"].to_numpy() if "group" in train else None
        tokenized = TokenizedTable(
            train["id"].tolist(),
            None,
            {"input_ids": Sequences.from_list([np.array([1])] * len(train))},
            groups,
        )
        _, validation = carve_validation(tokenized, sizes[task], committed["seed"])
        assert not set(validation.ids) & set(dev["id"]), task
        if task == "quora":
            held = train[train["id"].isin(validation.ids)]
            questions = {normalise_question(q) for c in ("sentence1", "sentence2") for q in held[c]}
            dev_questions = {normalise_question(q) for c in ("sentence1", "sentence2") for q in dev[c]}
            assert not questions & dev_questions


def test_heads_learn_at_their_own_rate_decayed_with_the_encoder():
    torch.manual_seed(0)
    model = MultitaskBert(BertModel(TINY), "siamese-concat", "cross-encoder", 0.1, "mean")
    optimizer = build_optimizer("adamaxw", model, lr=1e-5, weight_decay=0.01, head_lr=1e-3)
    rates = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            rates[id(p)] = group["lr"]
    assert {rates[id(p)] for p in model.encoder.parameters() if p.requires_grad} == {1e-5}
    assert {rates[id(p)] for p in model.heads.parameters()} == {1e-3}
    assert sum(len(g["params"]) for g in optimizer.param_groups) == sum(
        p.requires_grad for p in model.parameters()
    )
    scheduler = build_scheduler("exponential", optimizer, gamma=0.9)
    optimizer.step()  # no gradients: changes nothing, keeps the scheduler's order check quiet
    scheduler.step()
    assert sorted({round(g["lr"], 12) for g in optimizer.param_groups}) == [9e-6, 9e-4]
    # Without head_lr, one rate for everything (the paper's setting).
    plain = build_optimizer("adamw", model, lr=1e-5, weight_decay=0.01)
    assert {g["lr"] for g in plain.param_groups} == {1e-5}


def _steps_and_examples(settings, sizes: dict[str, int]) -> tuple[int, dict]:
    rng = np.random.default_rng(0)
    lengths = {t: rng.integers(5, 60, n) for t, n in sizes.items()}
    steps = epoch_steps(
        lengths,
        settings.batch_size,
        np.random.default_rng(0),
        one_task_per_step=settings.gradient == "round-robin",
        batches_per_step=settings.batches_per_step,
    )
    seen = {t: sum(len(s[t]) for s in steps if t in s) for t in lengths}
    return len(steps), seen


# Training rows per task: the cpu scale's, and the whole splits (SST's and STS's; Quora's
# carved 16k), whose batches per epoch are not a multiple of 3 at the gpu scale's batches.
SIZES = {
    "cpu": {"sst": 2304, "quora": 1152, "sts": 1152},
    "whole": {"sst": 8544, "quora": 16170, "sts": 6040},
}


@pytest.mark.parametrize("scale,rows", [("cpu", "cpu"), ("gpu", "whole"), ("paper", "whole")])
def test_fair_ablations_match_pcgrads_work(committed, scale, rows):
    """`best-summed` and `best-round-robin-equal` make the optimizer steps and see the
    examples of `best` (PCGrad), at every scale; the paper's round-robin row makes three
    times the steps."""
    committed["scale"] = scale
    sizes, carved = SIZES[rows], {"kind": "carved-from-dev", "train_pairs": 16170}

    def work(config):
        return _steps_and_examples(params.multitask_settings(committed, config, carved), sizes)

    best = work("best")
    assert work("best-summed") == best and work("best-round-robin-equal") == best
    assert work("best-round-robin")[0] == 3 * best[0]
    summed = params.multitask_settings(committed, "best-summed", carved)
    assert (summed.gradient, summed.smart is not None, summed.optimizer) == ("summed", True, "adamaxw")


def test_paper_scale_quora_batch_keeps_the_papers_batches_per_epoch(committed):
    committed["scale"] = "paper"
    carved = {"kind": "carved-from-dev", "train_pairs": 16170}
    settings = params.multitask_settings(committed, "baseline", carved)
    batch = settings.batch_size["quora"]
    assert batch == 4
    # Batches per epoch of each task on the data a paper-scale run trains on.
    sizes = {"sst": 8544, "sts": 6040}
    paper = {t: n / settings.batch_size[t] for t, n in sizes.items()}
    paper["quora"] = params.QUORA_OFFICIAL_TRAIN_PAIRS / 36
    ours = {**paper, "quora": (16170 - settings.validation_examples["quora"]) / batch}
    for task in paper:
        assert ours[task] / ours["sst"] == pytest.approx(paper[task] / paper["sst"], rel=0.05), task
    # The unscaled 36 would repeat Quora's carved pairs about 9.5 times per SST epoch.
    assert paper["sst"] / (16170 / 36) > 9
    assert params.multitask_settings(committed, "baseline", {"kind": "official"}).batch_size["quora"] == 36
    # The rule needs the data stage's split: without it, an error rather than a guess.
    with pytest.raises(ParamsError, match="Quora split"):
        params.multitask_settings(committed, "baseline")
    committed["scale"] = "cpu"
    cpu = params.multitask_settings(committed, "baseline", carved)
    assert cpu.batch_size["quora"] == committed["scales"]["cpu"]["multitask"]["batch_size"]["quora"]


class _Scripted:
    """An epoch loop whose validation scores are given: epoch 0 first."""

    steps_per_epoch = 1

    def __init__(self, scores):
        self.scores, self.model, self.ran = list(scores), torch.nn.Linear(1, 1), []

    def before(self):
        return {"epoch": 0}, self.scores[0]

    def epoch(self, epoch, step, log):
        self.ran.append(epoch)
        with torch.no_grad():
            self.model.weight.fill_(epoch)  # the weights say which epoch they are
        return {"epoch": epoch}, self.scores[epoch]

    def state(self):
        return {}

    def load_state(self, state):
        pass


def test_the_start_is_a_candidate_and_patience_stops_a_run_that_stopped_improving():
    from minbert.train.loop import Epochs

    # Epoch 0 beats every fine-tuned epoch: kept, with its own weights back in the model.
    loop = _Scripted([0.5, 0.4, 0.3])
    history, kept = Epochs().run(loop, 2, "t")
    assert kept == 0 and len(history) == 3 and float(loop.model.weight) != 2.0
    # A tie keeps the earlier epoch.
    assert Epochs().run(_Scripted([0.5, 0.5]), 1, "t")[1] == 0
    # Patience 1: after epoch 2 (no better than epoch 1) no other epoch runs.
    loop = _Scripted([0.1, 0.3, 0.2, 0.9, 0.9])
    history, kept = Epochs().run(loop, 4, "t", patience=1)
    assert loop.ran == [1, 2] and kept == 1 and float(loop.model.weight) == 1.0 and len(history) == 3
    # Patience 0: every epoch runs.
    loop = _Scripted([0.1, 0.3, 0.2, 0.9, 0.9])
    assert Epochs().run(loop, 4, "t")[1] == 3 and loop.ran == [1, 2, 3, 4]


def test_patience_counts_epochs_that_gain_no_more_than_the_margin():
    from minbert.train.loop import Epochs

    # Epochs 2 and 3 rise above epoch 1 (the last gain) by less than the margin: patience 2
    # stops after epoch 3, and the best of them (epoch 3) is still the one kept.
    loop = _Scripted([0.1, 0.3, 0.32, 0.34, 0.9, 0.9])
    history, kept = Epochs().run(loop, 5, "t", patience=2, margin=lambda reference: 0.05)
    assert loop.ran == [1, 2, 3] and kept == 3 and float(loop.model.weight) == 3.0
    # Small steps that add up past the margin are a gain: epoch 3 is 0.06 above epoch 1.
    loop = _Scripted([0.1, 0.3, 0.33, 0.36, 0.37, 0.37])
    assert Epochs().run(loop, 5, "t", patience=2, margin=lambda reference: 0.05)[1] == 4
    assert loop.ran == [1, 2, 3, 4, 5]
    # Without the margin, each small rise restarts the count and every epoch runs.
    loop = _Scripted([0.1, 0.3, 0.32, 0.34, 0.9, 0.9])
    assert Epochs().run(loop, 5, "t", patience=2)[1] == 4 and loop.ran == [1, 2, 3, 4, 5]


def test_the_noise_margin_is_a_correlations_standard_error():
    from minbert.metrics import correlation_noise

    assert correlation_noise(0.8, 100) == pytest.approx((0.36 / 98) ** 0.5)
    assert correlation_noise(0.27, 500) == pytest.approx(0.0431, abs=1e-4)
    assert correlation_noise(1.0, 10) == 0.0
