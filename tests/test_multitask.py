"""Multitask fine-tuning: heads, losses, round-robin batches, and tiny training runs."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, TINY, tiny_multitask_scale

from minbert.data.batches import TokenizedTable
from minbert.data.multitask import TaskData, epoch_steps, task_batches
from minbert.data.predictions import read_predictions
from minbert.data.tokenize import tokenize_prepared
from minbert.metrics import score
from minbert.model.bert import BertModel
from minbert.model.heads import build_pair_head
from minbert.model.multitask import MultitaskBert, task_loss
from minbert.pipeline import multitask
from minbert.pipeline import params as params_module
from minbert.pipeline.params import resolve_multitask
from minbert.pipeline.schema import validate
from minbert.results import read_result
from minbert.settings import PAIR_HEADS
from minbert.tasks import MULTITASK_TASKS, SELECTION
from minbert.train.multitask import LOSS_LOG_STEPS


def run_stage(params: dict, config: str, tokenized: Path, manifest: Path, *args, **kwargs) -> dict:
    """The stage with the settings the resolve stage would write."""
    quora_split = json.loads(Path(manifest).read_text())["quora_split"]
    return multitask.run(resolve_multitask(params, config, quora_split), tokenized, manifest, *args, **kwargs)


def run_in(out: Path, params: dict, config: str, tokenized: Path, **kwargs) -> dict:
    """The stage on the tokenized fixture, writing metrics, predictions and its resume
    state under ``out``."""
    return run_stage(
        params,
        config,
        tokenized / "tok",
        tokenized / "prepared" / "manifest.json",
        out / "metrics",
        out / "pred",
        resume_dir=out / "resume",
        **kwargs,
    )


WORDS = ["good", "bad", "film", "what", "is", "how", "a", "the", "man", "dog", "runs", "plays"]


def _sentences(rng, n):
    return [" ".join(rng.choice(WORDS, size=rng.integers(2, 10))) for _ in range(n)]


def _prepared(directory, n=24):
    directory.mkdir()
    rng = np.random.default_rng(0)
    for split in ("train", "dev", "test"):
        ids = [f"{split}{i}" for i in range(n)]
        lines = np.arange(2, n + 2)
        sst = {"id": ids, "sentence": _sentences(rng, n), "line": lines}
        pair = {"id": ids, "sentence1": _sentences(rng, n), "sentence2": _sentences(rng, n), "line": lines}
        if split != "test":
            sst["label"] = rng.integers(0, 5, n)
        pd.DataFrame(sst).to_parquet(directory / f"sst-{split}.parquet")
        for task, labels in (("quora", rng.integers(0, 2, n)), ("sts", np.round(rng.uniform(0, 5, n), 1))):
            if task == "quora" and split == "test":
                continue  # offline, the carved Quora split has no test part
            frame = dict(pair)
            if split != "test":
                frame["label"] = labels
            pd.DataFrame(frame).to_parquet(directory / f"{task}-{split}.parquet")
    (directory / "manifest.json").write_text(json.dumps({"quora_split": {"kind": "carved-from-dev"}}))


def tiny_tables(root: Path, checkpoint: Path) -> Path:
    """``root`` with the random tables under prepared/ and their WordPiece ids under tok/."""
    _prepared(root / "prepared")
    tokenize_prepared(
        root / "prepared", root / "tok", checkpoint / "vocab.txt", {"sst": 32, "quora": 32, "sts": 32}
    )
    return root


def _train_and_dev(tokenized: Path) -> dict[tuple[str, str], TokenizedTable]:
    return {
        (t, s): TokenizedTable.read(tokenized / "tok" / f"{t}-{s}.parquet")
        for t in MULTITASK_TASKS
        for s in ("train", "dev")
    }


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, tiny_checkpoint):
    return tiny_tables(tmp_path_factory.mktemp("mt"), tiny_checkpoint)


@pytest.fixture
def tiny_params(tiny_checkpoint):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p.update(checkpoint=str(tiny_checkpoint), device="cpu")
    tiny_multitask_scale(
        p, epochs=2, batch_size={"sst": 8, "quora": 6, "sts": 4}, history={"dev": 10, "train": 6}
    )
    p["scales"]["cpu"]["multitask"]["eval_batch_size"] = 7
    return validate(p)


def test_pair_heads_shapes_and_registry():
    u, v = torch.randn(5, 32), torch.randn(5, 32)
    for name, tasks in PAIR_HEADS.items():
        for task in tasks:
            head = build_pair_head(name, task, 32, 0.0)
            out = head(torch.randn(5, 32)) if not head.siamese else head(u, v)
            assert out.shape == (5,), name
    cosine = build_pair_head("siamese-cosine", "sts", 32, 0.0)
    assert torch.allclose(cosine(u, u), torch.full((5,), 5.0))  # identical -> top of the scale
    assert torch.allclose(cosine(u, -u), torch.full((5,), -5.0), atol=1e-6)  # 5 cos, unclipped
    w = torch.randn(5, 32)
    assert torch.allclose(cosine(u, w), 5.0 * torch.nn.functional.cosine_similarity(u, w, dim=-1))
    with pytest.raises(ValueError, match="cannot serve task 'quora'"):
        build_pair_head("siamese-cosine", "quora", 32, 0.0)
    with pytest.raises(ValueError, match="is not one of"):
        build_pair_head("bilinear", "sts", 32, 0.0)


def test_losses_on_logits():
    logits = torch.tensor([[2.0, 0.0, 0.0, 0.0, 0.0]])
    assert task_loss("sst", logits, torch.tensor([0])).item() == pytest.approx(
        -torch.log_softmax(logits, -1)[0, 0].item()
    )
    assert task_loss("quora", torch.tensor([0.0]), torch.tensor([1])).item() == pytest.approx(np.log(2))
    assert task_loss("sts", torch.tensor([3.0, 1.0]), torch.tensor([5.0, 1.0])).item() == pytest.approx(2.0)


def test_siamese_batch_encodes_both_sentences_in_one_pass(tokenized):
    table = TokenizedTable.read(tokenized / "tok" / "sts-train.parquet")
    data = TaskData("sts", table, siamese=True)
    batch = data.batch(np.array([3, 1]))
    assert batch.ids.shape[0] == 4
    assert (
        batch.ids[0, : len(table.sequences["input_ids_1"][3])].tolist()
        == table.sequences["input_ids_1"][3].tolist()
    )
    assert (
        batch.ids[3, : len(table.sequences["input_ids_2"][1])].tolist()
        == table.sequences["input_ids_2"][1].tolist()
    )
    cross = TaskData("sts", table, siamese=False).batch(np.array([2]))
    assert cross.token_types is not None and set(cross.token_types[0].tolist()) == {0, 1}
    model = MultitaskBert(BertModel(TINY), "siamese-concat", "siamese-concat", 0.0).eval()
    calls = []
    model.encoder.register_forward_pre_hook(lambda *a: calls.append(1))
    model.encoder.encoder.register_forward_pre_hook(lambda *a: calls.append(2))
    assert model("sts", batch).shape == (2,)
    assert calls == [2]  # the transformer layers ran once for both sentences


LENGTHS = {"sst": np.arange(50) % 7 + 1, "quora": np.arange(13) % 5 + 1, "sts": np.arange(7) + 1}
SIZES = {"sst": 4, "quora": 3, "sts": 2}


def test_every_task_gets_the_same_number_of_batches_covering_every_example():
    batches = task_batches(LENGTHS, SIZES, np.random.default_rng(0))
    assert {t: len(b) for t, b in batches.items()} == {"sst": 13, "quora": 13, "sts": 13}  # ceil(50 / 4)
    for task, n in (("sst", 50), ("quora", 13), ("sts", 7)):
        seen = np.concatenate(batches[task])
        assert set(seen.tolist()) == set(range(n)), task
    # STS needs 4 batches per pass: its passes are reshuffled, not replayed.
    sts = [b.tolist() for b in batches["sts"]]
    passes = [sts[i : i + 4] for i in range(0, 12, 4)]
    assert len({json.dumps(p) for p in passes}) > 1


def test_round_robin_steps_one_task_at_a_time_in_a_cycle():
    """The paper's round-robin: one task's batch per step, SST, Quora, STS, SST, ...,
    and every task the same number of batches per epoch."""
    steps = epoch_steps(LENGTHS, SIZES, np.random.default_rng(0), one_task_per_step=True)
    assert len(steps) == 3 * 13
    assert all(len(step) == 1 for step in steps)
    assert [next(iter(step)) for step in steps] == ["sst", "quora", "sts"] * 13
    counts = {t: sum(t in step for step in steps) for t in MULTITASK_TASKS}
    assert counts == {"sst": 13, "quora": 13, "sts": 13}
    # The same batches as the joint modes draw from the same generator, in cycle order.
    joint = epoch_steps(LENGTHS, SIZES, np.random.default_rng(0), one_task_per_step=False)
    assert len(joint) == 13 and all(set(step) == set(MULTITASK_TASKS) for step in joint)
    for i, step in enumerate(steps):
        task = next(iter(step))
        assert step[task].tolist() == joint[i // 3][task].tolist()


@pytest.mark.parametrize("k", [2, 3, 5])
def test_steps_of_several_batches_take_the_same_rows_in_the_same_order(k):
    """``batches_per_step`` k: round-robin makes ceil(3n / k) steps (13 batches, k = 3: the
    joint modes' 13), each task's steps hold its batches of k = 1, consecutive, in order,
    as evenly as its share of the steps allows, rows sorted by length; the same examples."""
    plain = task_batches(LENGTHS, SIZES, np.random.default_rng(0))
    steps = epoch_steps(LENGTHS, SIZES, np.random.default_rng(0), one_task_per_step=True, batches_per_step=k)
    assert len(steps) == -(-3 * 13 // k) and all(len(step) == 1 for step in steps)
    assert [next(iter(step)) for step in steps] == (["sst", "quora", "sts"] * 13)[: len(steps)]
    for task in MULTITASK_TASKS:
        mine = [step[task] for step in steps if task in step]
        whole = np.concatenate(plain[task])
        assert sorted(np.concatenate(mine).tolist()) == sorted(whole.tolist())
        at, taken = 0, []
        for rows in mine:  # a run of whole consecutive batches, sorted by length
            group, start = [], at
            while len(group) < len(rows):
                group += plain[task][at].tolist()
                at += 1
            assert sorted(group) == sorted(rows.tolist()) and (np.diff(LENGTHS[task][rows]) >= 0).all()
            taken.append(at - start)
        assert at == 13 and max(taken) - min(taken) <= 1
    joint = epoch_steps(LENGTHS, SIZES, np.random.default_rng(0), one_task_per_step=False, batches_per_step=k)
    assert len(joint) == -(-13 // k) and all(set(step) == set(MULTITASK_TASKS) for step in joint)
    for task in MULTITASK_TASKS:
        assert len(np.concatenate([step[task] for step in joint])) == len(np.concatenate(plain[task]))
    if k == 3:
        assert len(steps) == 13


def test_a_step_of_more_batches_than_leave_every_task_a_step_is_refused():
    with pytest.raises(ValueError, match="batches_per_step 27 leaves a task no step: each has 13 batches"):
        epoch_steps(LENGTHS, SIZES, np.random.default_rng(0), one_task_per_step=True, batches_per_step=27)


def test_round_robin_training_updates_after_every_task_batch(tokenized, tiny_params):
    """Each round-robin step trains one task: its head's weights move, the others' do not."""
    from minbert.train.multitask_step import MultitaskStep

    settings = params_module.multitask_settings(tiny_params, "baseline")
    assert settings.gradient == "round-robin"
    model = MultitaskBert(
        BertModel.from_pretrained(tiny_params["checkpoint"]), "siamese-concat", "siamese-concat", 0.0, "mean"
    )
    train = {
        t: TaskData(t, TokenizedTable.read(tokenized / "tok" / f"{t}-train.parquet"), model.is_siamese(t))
        for t in MULTITASK_TASKS
    }
    step = MultitaskStep(settings, model, train, torch.device("cpu"))
    before = {t: model.heads[t].linear.weight.detach().clone() for t in MULTITASK_TASKS}
    losses, stats = step({"quora": np.arange(6)})
    assert stats is None and losses[0].abs().sum() == 0 and losses[2].abs().sum() == 0
    assert losses[1, 0] > 0 and losses[1, 1:].abs().sum() == 0  # without SMART: the loss, then zeros
    moved = {t: not torch.equal(before[t], model.heads[t].linear.weight) for t in MULTITASK_TASKS}
    assert moved == {"sst": False, "quora": True, "sts": False}


def _graph_pair(tiny_params, tokenized, config="baseline", dropout=0.1, capturable=False):
    """The same model and data twice: an eager step and, beside it, a second copy (its
    optimizer built ``capturable``)."""
    from minbert.train.multitask_step import MultitaskStep

    settings = params_module.multitask_settings(tiny_params, config)
    steps = []
    for copy in range(2):
        torch.manual_seed(0)
        model = MultitaskBert(
            BertModel.from_pretrained(tiny_params["checkpoint"]),
            settings.paraphrase_head,
            settings.sts_head,
            dropout,
            "mean",
        ).train()
        train = {
            t: TaskData(t, TokenizedTable.read(tokenized / "tok" / f"{t}-train.parquet"), model.is_siamese(t))
            for t in MULTITASK_TASKS
        }
        steps.append(
            MultitaskStep(settings, model, train, torch.device("cpu"), capturable=capturable and copy == 1)
        )
    return steps


def test_a_graphed_step_trains_as_the_eager_step(tokenized, tiny_params, one_thread):
    """GraphedStep with a stand-in capture (a replay reruns the step on the graph's own
    input tensors): a shape's first step eager, its later ones replays refilled with each
    step's batch; weights, losses and dropout's random numbers as the eager step's, bit
    for bit. A replay that kept its first batch would train on other rows."""
    from minbert.train.graphed_step import GraphedStep

    eager, graphed_base = _graph_pair(tiny_params, tokenized)
    captures = []

    def stand_in(fn, generators):
        captures.append(fn)
        return fn  # recording runs nothing; each replay runs the step

    graphed = GraphedStep(graphed_base, new_capture=lambda: stand_in)
    lengths = eager.train["sst"].lengths
    longest = int(np.argmax(lengths))
    others = [i for i in range(len(lengths)) if i != longest]
    # Two SST batches of one shape (both hold the longest row) and different rows: SST's
    # graph is captured on `second` (step 2), then replayed refilled with `first` (step 3).
    first, second = np.array([longest, *others[:3]]), np.array([longest, *others[3:6]])
    plan = [{"sst": first}, {"quora": np.arange(6)}, {"sst": second}, {"sst": first}, {"quora": np.arange(6)}]
    # Each run from the same generator state: dropout draws the same masks in both.
    torch.manual_seed(1)
    expected = [eager(rows, 0, i)[0] for i, rows in enumerate(plan)]
    torch.manual_seed(1)
    got = [graphed(rows, 0, i) for i, rows in enumerate(plan)]
    for i, ((losses, gram), want) in enumerate(zip(got, expected)):
        assert gram is None and torch.equal(losses, want), (i, losses, want)
    eager.flush()
    graphed.step.flush()
    assert graphed.eager_steps == 2 and len(graphed.graphs) == len(captures) == 2
    for (name, a), b in zip(eager.model.named_parameters(), graphed.step.model.parameters()):
        assert torch.equal(a, b), name


class _PoolRule:
    """A stand-in capture that keeps CUDA's rule for a graphs' memory pool: once every
    graph captured into it is dropped, the pool is freed and a capture into it fails
    (torch: ``use_count > 0 INTERNAL ASSERT``, seen on an H200)."""

    def __init__(self):
        self.live, self.freed = 0, False

    def __call__(self, fn, generators):
        gc.collect()  # the replays' reference cycles, as CPython frees them
        if self.freed:
            raise RuntimeError("capture into a freed pool")
        self.live += 1
        replay = _Replay(fn)
        weakref.finalize(replay, self._dropped)
        return replay

    def _dropped(self):
        self.live -= 1
        self.freed = self.live == 0


class _Replay:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self):
        self.fn()


def test_graphs_dropped_are_captured_again_into_a_new_pool(tokenized, tiny_params, one_thread):
    """After reset() (the check against eager, a new learning rate) a shape is captured
    again: into a new pool, not the one its dropped graphs freed."""
    from minbert.train.graphed_step import GraphedStep, compare_with_eager

    _, base = _graph_pair(tiny_params, tokenized)
    pools = []

    def new_pool():
        pools.append(_PoolRule())
        return pools[-1]

    graphed = GraphedStep(base, new_capture=new_pool)
    for _ in range(3):
        graphed({"sst": np.arange(8)})
    check = compare_with_eager(graphed, [{"sst": np.arange(8)}] * 3)
    graphed({"sst": np.arange(8)})
    graphed({"sst": np.arange(8)})
    assert check.passed and pools[0].freed and pools[-1].live == 1, [(p.live, p.freed) for p in pools]


@pytest.mark.parametrize("replays", ["the step", "nothing"])
def test_compare_with_eager_passes_a_true_replay_and_fails_an_empty_one(
    tokenized, tiny_params, one_thread, replays
):
    """The check a GPU run makes before timing graphs (bench/paper_epoch.py): a stand-in
    graph that reruns the step trains as the eager step, to the bit; one whose replay does
    nothing is caught. Either way the weights are as before the check."""
    from minbert.train.graphed_step import GraphedStep, compare_with_eager

    _, base = _graph_pair(tiny_params, tokenized)
    capture = (lambda fn, generators: fn) if replays == "the step" else (lambda fn, generators: lambda: None)
    graphed = GraphedStep(base, new_capture=lambda: capture)
    for task, n in (("sst", 8), ("quora", 6), ("sts", 4)):  # every head trained once
        graphed({task: np.arange(n)})
    before = [p.detach().clone() for p in base.model.parameters()]
    plan = [{"sst": np.arange(8)}, {"quora": np.arange(6)}, {"sst": np.arange(8)}, {"sst": np.arange(8)}]
    check = compare_with_eager(graphed, plan)
    assert check.steps == 4 and check.eager_loss_difference == 0 and check.eager_weight_difference == 0
    if replays == "the step":
        assert check.passed and check.loss_difference == 0 and check.weight_difference == 0
    else:
        assert not check.passed and check.loss_difference > 0.01 and check.weight_difference > 0
    assert base.model.training and not graphed.graphs
    assert all(torch.equal(a, b) for a, b in zip(before, base.model.parameters()))


def test_cuda_graphs_is_accepted_for_every_configuration_at_every_scale():
    """check-params takes ``multitask.cuda_graphs: true`` at every scale for every
    configuration: whether a run can be captured is its own check's (choose_steps)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for sized in params["scales"].values():
        sized["multitask"]["cuda_graphs"] = True
    validate(params)
    for scale in params["scales"]:
        for config in params["configs"]:
            settings = params_module.multitask_settings(
                {**params, "scale": scale}, config, {"kind": "official"}
            )
            assert settings.cuda_graphs, (scale, config)


@pytest.mark.parametrize("replays", ["the step", "nothing"])
def test_a_run_takes_its_graphs_only_once_they_train_as_eager(tokenized, tiny_params, one_thread, replays):
    """choose_steps: off, or without a CUDA device, the eager step and why; with graphs whose
    check against eager on the run's first batches passes, the graphed step; a graph that
    replays nothing fails the check and the run stays eager, saying so."""
    from minbert.train.graphed_step import GraphedStep
    from minbert.train.step_execution import CHECK_REPEATS, check_plan, choose_steps

    _, base = _graph_pair(tiny_params, tokenized)
    lengths = {t: d.lengths for t, d in base.train.items()}
    plan = check_plan(lengths, {"sst": 8, "quora": 6, "sts": 4}, 0, one_task_per_step=True)
    assert len(plan) == len(MULTITASK_TASKS) * CHECK_REPEATS
    assert [set(rows) for rows in plan[::CHECK_REPEATS]] == [{t} for t in ("sst", "quora", "sts")]
    assert choose_steps(base, False, plan) == (base, False, "eager: multitask.cuda_graphs is off")
    step, graphs, why = choose_steps(base, True, plan)
    assert step is base and not graphs and "need a CUDA device, the run's is cpu" in why
    capture = (lambda fn, generators: fn) if replays == "the step" else (lambda fn, generators: lambda: None)
    before = [p.detach().clone() for p in base.model.parameters()]
    step, graphs, why = choose_steps(base, True, plan, new_capture=lambda: capture)
    assert all(
        torch.equal(a, b) for a, b in zip(before, base.model.parameters())
    )  # the check leaves no trace
    if replays == "the step":
        assert isinstance(step, GraphedStep) and graphs and why.startswith("CUDA graphs, checked")
    else:
        assert step is base and not graphs and "failed their check" in why


@pytest.mark.parametrize(
    "change, why",
    [
        ({"optimizer": "adamaxw"}, "AdamaxW \\(not capturable\\)"),
        ({"config": "best"}, "AdamaxW \\(not capturable\\)"),
    ],
)
def test_graphed_step_refuses_what_a_graph_cannot_hold(tokenized, tiny_params, change, why):
    import dataclasses

    from minbert.train.graphed_step import GraphedStep
    from minbert.train.multitask_step import MultitaskStep

    settings = params_module.multitask_settings(tiny_params, change.get("config", "baseline"))
    settings = dataclasses.replace(settings, **{k: v for k, v in change.items() if k != "config"})
    if "optimizer" in change:
        settings = dataclasses.replace(settings, smart=None, gradient="round-robin")
    encoder = BertModel.from_pretrained(tiny_params["checkpoint"])
    model = MultitaskBert(encoder, settings.paraphrase_head, settings.sts_head, 0.0, "mean")
    train = {
        t: TaskData(t, TokenizedTable.read(tokenized / "tok" / f"{t}-train.parquet"), model.is_siamese(t))
        for t in MULTITASK_TASKS
    }
    with pytest.raises(ValueError, match=f"CUDA graphs: .*{why}"):
        GraphedStep(
            MultitaskStep(settings, model, train, torch.device("cpu")),
            new_capture=lambda: lambda fn, generators: fn,
        )


def test_compare_with_eager_draws_pcgrad_orders_alike_in_every_run(tokenized, tiny_params, one_thread):
    """Each of the check's runs draws PCGrad's visit orders from the same generator state,
    and the check leaves that state as it found it."""
    from minbert.train.graphed_step import GraphedStep, compare_with_eager

    _, base = _graph_pair(tiny_params, tokenized, "best-no-smart", capturable=True)
    graphed = GraphedStep(base, new_capture=lambda: lambda fn, generators: fn)
    plan = _pcgrad_plan(base, 6)
    graphed(plan[0])
    before = base.pcgrad_generator.get_state()
    check = compare_with_eager(graphed, plan)
    assert check.passed and check.eager_weight_difference == 0 and check.weight_difference == 0
    assert torch.equal(base.pcgrad_generator.get_state(), before)


def test_graphed_step_takes_pcgrad_and_a_capturable_adamaxw(tokenized, tiny_params):
    from minbert.train.graphed_step import refusal

    eager, capturable = _graph_pair(tiny_params, tokenized, "best-no-smart", capturable=True)
    assert eager.pcgrad is not None and capturable.pcgrad is not None
    assert "AdamaxW (not capturable)" in refusal(eager) and refusal(capturable) is None


def _same_shape_batches(step, task: str, size: int, count: int) -> list[np.ndarray]:
    """``count`` different batches of ``task`` that pad alike: each holds its longest row."""
    lengths = step.train[task].lengths
    longest = int(np.argmax(lengths))
    others = [i for i in range(len(lengths)) if i != longest]
    return [np.array([longest, *others[i * (size - 1) : (i + 1) * (size - 1)]]) for i in range(count)]


def _pcgrad_plan(step, steps: int) -> list[dict[str, np.ndarray]]:
    """PCGrad steps of all three tasks, each task cycling through batches of one shape."""
    batches = {t: _same_shape_batches(step, t, n, 3) for t, n in (("sst", 6), ("quora", 5), ("sts", 4))}
    return [{t: b[(i * (k + 1)) % 3] for k, (t, b) in enumerate(batches.items())} for i in range(steps)]


def _stale_orders(step, new_capture):
    """A GraphedStep whose replays keep the orders they were captured with (not refilled)."""
    from minbert.train.graphed_step import GraphedStep

    class Stale(GraphedStep):
        def visit_orders(self, loaded):
            return None

    return Stale(step, new_capture)


@pytest.mark.parametrize("refill", [True, False], ids=["refilled", "stale-orders"])
def test_a_graphed_pcgrad_step_trains_as_the_eager_step(tokenized, tiny_params, one_thread, refill):
    """best-no-smart (PCGrad, AdamaxW) through GraphedStep with a stand-in capture, its
    optimizer built capturable, against the eager step: 20 steps' losses, Gram matrices,
    weights and optimizer state equal to the bit, when each replay's visit orders are
    drawn as the eager step draws them; replays that keep their capture's orders train
    apart (the refill is what keeps a real graph's surgery the eager one)."""
    from minbert.train.graphed_step import GraphedStep

    eager, base = _graph_pair(tiny_params, tokenized, "best-no-smart", capturable=True)
    capture = lambda fn, generators: fn  # noqa: E731  recording runs nothing; each replay runs the step
    graphed = (GraphedStep if refill else _stale_orders)(base, new_capture=lambda: capture)
    plan = _pcgrad_plan(eager, 20)
    torch.manual_seed(1)
    expected = [eager(rows, 0, i) for i, rows in enumerate(plan)]
    torch.manual_seed(1)
    got = [graphed(rows, 0, i) for i, rows in enumerate(plan)]
    eager.flush()
    graphed.step.flush()
    assert graphed.eager_steps == 1 and len(graphed.graphs) == 1  # one shape: 19 replays
    equal = [torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected)]
    weights = [torch.equal(a, b) for a, b in zip(eager.model.parameters(), base.model.parameters())]
    if refill:
        assert all(equal) and all(weights), equal
        assert sum(bool(s) for s in base.optimizer.state.values()) > 10
        for a, b in zip(eager.model.parameters(), base.model.parameters()):
            sa, sb = eager.optimizer.state[a], base.optimizer.state[b]
            assert sa.keys() == sb.keys() and (not sa or a.requires_grad)  # frozen: no state
            if sa:
                assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_inf"], sb["exp_inf"])
                assert sb["step"].item() == sa["step"] == 20
        assert torch.equal(eager.pcgrad_generator.get_state(), base.pcgrad_generator.get_state())
    else:
        assert not all(equal) and not all(weights)


@pytest.fixture
def one_thread():
    """A 32-wide model gains nothing from threads, and on a busy machine they spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("smart", [False, True], ids=["plain", "smart"])
@pytest.mark.parametrize("gradient", ["round-robin", "summed", "pcgrad"])
def test_every_gradient_mode_lowers_the_loss_of_a_tiny_batch(
    tokenized, tiny_params, one_thread, gradient, smart
):
    """Three updates on one fixed batch per task lower every task's loss, in each gradient
    mode, with and without SMART (its default settings, those of ``best``)."""
    import dataclasses

    from minbert.train.multitask_step import MultitaskStep

    base = params_module.multitask_settings(tiny_params, "baseline")
    smart_settings = params_module.multitask_settings(tiny_params, "best").smart if smart else None
    settings = dataclasses.replace(base, gradient=gradient, smart=smart_settings)
    torch.manual_seed(0)
    model = MultitaskBert(
        BertModel.from_pretrained(tiny_params["checkpoint"]), base.paraphrase_head, base.sts_head, 0.0, "mean"
    )
    train = {
        t: TaskData(t, TokenizedTable.read(tokenized / "tok" / f"{t}-train.parquet"), model.is_siamese(t))
        for t in MULTITASK_TASKS
    }
    step = MultitaskStep(settings, model, train, torch.device("cpu"))
    batch = {t: np.arange(6) for t in MULTITASK_TASKS}
    # A round-robin step trains one task; the joint modes, all three at once.
    steps = [{t: batch[t]} for t in MULTITASK_TASKS] if gradient == "round-robin" else [batch]
    # Each step returns its batches' losses before its update: (task, loss parts).
    losses = [sum(step(rows)[0] for rows in steps)[:, 0] for _ in range(4)]
    step.flush()
    assert (losses[-1] < losses[0]).all(), (losses[0], losses[-1])


def _step_after(tiny_params, tokenized, config: str, max_tokens: int, rows: dict) -> tuple:
    """The losses and the gradients (clipped) of one step of ``config`` (no dropout) on
    ``rows`` with ``max_tokens``."""
    import dataclasses

    from minbert.train.multitask_step import MultitaskStep

    settings = params_module.multitask_settings(tiny_params, config)
    settings = dataclasses.replace(settings, max_tokens=max_tokens)
    torch.manual_seed(0)
    model = MultitaskBert(
        BertModel.from_pretrained(tiny_params["checkpoint"]),
        settings.paraphrase_head,
        settings.sts_head,
        0.0,
        "mean",
    )
    for module in model.modules():  # no dropout: the two runs draw their masks in other shapes
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0
    train = {
        t: TaskData(t, TokenizedTable.read(tokenized / "tok" / f"{t}-train.parquet"), model.is_siamese(t))
        for t in MULTITASK_TASKS
    }
    step = MultitaskStep(settings, model, train, torch.device("cpu"))
    losses, _ = step(rows)
    step.flush()
    return losses, [p.grad.clone() for p in model.parameters() if p.grad is not None], train


@pytest.mark.parametrize("config", ["best-round-robin", "best-summed"])
def test_a_batch_cut_into_pieces_trains_as_the_whole_batch(tokenized, tiny_params, one_thread, config):
    """Above ``max_tokens`` a task's batch runs in pieces whose gradients add up: the same
    step (SMART's terms included: its noise is drawn for the whole batch) as in one pass."""
    rows = (
        {"sst": np.arange(12)}
        if config == "best-round-robin"
        else {t: np.arange(12) for t in MULTITASK_TASKS}
    )
    whole, grads_whole, train = _step_after(tiny_params, tokenized, config, 0, rows)
    longest = int(train["sst"].lengths[rows["sst"]].max())
    cut, grads_cut, _ = _step_after(tiny_params, tokenized, config, 4 * longest, rows)
    # The loss and the Bregman term to float precision; the adversarial term and its control
    # are differences of outputs 1e-5 apart, whose rounding follows the padded shape.
    torch.testing.assert_close(cut[:, [0, 3]], whole[:, [0, 3]], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cut[:, 1:3], whole[:, 1:3], rtol=0, atol=2e-5)
    assert len(grads_cut) == len(grads_whole)
    assert not all(torch.equal(a, b) for a, b in zip(grads_whole, grads_cut))  # the pieces ran apart
    for a, b in zip(grads_whole, grads_cut):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-6)


def test_pcgrad_refuses_to_cut_a_batch_into_pieces(tokenized, tiny_params, one_thread):
    """PCGrad needs each task's whole graph: a batch above ``max_tokens`` is an error that
    names the setting, never a silent change of method."""
    with pytest.raises(ValueError, match="max_tokens: sst's batch of 12 rows"):
        _step_after(tiny_params, tokenized, "best", 16, {t: np.arange(12) for t in MULTITASK_TASKS})


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", ["baseline", "cosine-sts", "concatenation", "best-no-smart", "best-round-robin", "best"]
)
def test_tiny_training_run_writes_outputs(tmp_path, tokenized, tiny_params, config):
    metrics = run_in(tmp_path, tiny_params, config, tokenized)
    # Each task's number is its metric of the dev predictions the run wrote.
    for task in MULTITASK_TASKS:
        dev = TokenizedTable.read(tokenized / "tok" / f"{task}-dev.parquet")
        written = read_predictions(tmp_path / "pred" / config / f"{task}-dev-out.csv")
        predicted = np.array([float(written[i]) for i in dev.ids])
        assert metrics[task] == pytest.approx(score(task, dev.labels, predicted), abs=1e-4), task
    assert metrics["average"] == pytest.approx(np.mean([metrics[t] for t in MULTITASK_TASKS]), abs=2e-4)
    # The metrics file holds the numbers a user compares; the record beside it the rest.
    numbers = json.loads((tmp_path / "metrics" / f"{config}.json").read_text())
    assert set(numbers) == {*MULTITASK_TASKS, "average", "epoch", "steps"}
    assert read_result(tmp_path / "metrics" / f"{config}.json") == json.loads(json.dumps(metrics))
    # Reported numbers are on the full dev sets; the history scores fixed slices.
    assert metrics["dev_examples"] == {"sst": 24, "quora": 24, "sts": 24}
    assert metrics["history_examples"] == {
        "dev": {"sst": 10, "quora": 10, "sts": 10},
        "train": {"sst": 6, "quora": 6, "sts": 6},
    }
    history = pd.read_csv(tmp_path / "metrics" / f"{config}-history.csv")
    assert history.epoch.tolist() == [0, 1, 2]  # epoch 0: before the first update
    assert history.loc[0, ["train_loss_sst", "lr"]].isna().all()
    trained = history[history.epoch > 0]
    # The epoch is chosen on the validation split (6 training rows per task set aside).
    assert metrics["validation_examples"] == {"sst": 6, "quora": 6, "sts": 6}
    # Chosen by the chance-corrected selection score (a constant answer scores 0 on it),
    # not by the plain average of the tables; the start (epoch 0) is a candidate.
    assert history.loc[history.val_selection.idxmax(), "epoch"] == metrics["epoch"]
    assert "mean of SST MCC, Quora MCC, STS Pearson" in metrics["selection"]
    assert set(metrics["dev_selection"]) == {"sst_mcc", "quora_mcc", "sts_pearson", "selection"}
    for column in ("val_average", "val_selection", "val_quora_mcc", "dev_average", "train_average"):
        assert history[column].notna().all(), column
    # Where fine-tuning started (heads fitted on the frozen checkpoint), scored on dev: what
    # every result of the run is compared with.
    assert set(metrics["head_warmup"]) == set(MULTITASK_TASKS) - (
        {"sts"} if metrics["settings"]["sts_head"] == "siamese-cosine" else set()
    )
    metric_keys = {"sst_accuracy", "quora_accuracy", "sts_pearson", "average"}
    assert set(metrics["start_dev"]) == metric_keys | set(metrics["dev_selection"])
    for task in MULTITASK_TASKS:
        assert (tmp_path / "pred" / config / f"{task}-dev-start-out.csv").is_file()
    smart = metrics["settings"]["smart"] is not None
    assert smart == (config.startswith("best") and config != "best-no-smart")
    # How the steps ran, in the record: eager on the CPU, whatever the setting.
    assert metrics["step_execution"] == {
        "cuda_graphs": False,
        "graphs": False,
        "why": "eager: multitask.cuda_graphs is off",
    }
    # SMART's terms are logged apart from the task losses.
    assert ("train_adversarial_sst" in history) == smart and ("train_bregman_sts" in history) == smart
    if smart:
        assert (trained.train_adversarial_quora >= 0).all() and (trained.train_bregman_sst >= 0).all()
    conflicts = pd.read_csv(tmp_path / "metrics" / f"{config}-conflicts.csv")
    if metrics["settings"]["gradient"] == "pcgrad":
        # 2 epochs x 5 steps: STS (24 pairs less 6 for validation, batch 4) has the most batches.
        assert len(conflicts) == 2 * 5 and (conflicts.pairs == 3).all()
        assert "pcgrad_conflict_fraction" in metrics
    else:
        assert conflicts.empty
    # Steps and examples over both epochs: one batch of every task per PCGrad step, one
    # task's per round-robin step; every task gets as many batches as the one with most.
    batches = max(-(-18 // b) for b in tiny_params["scales"]["cpu"]["multitask"]["batch_size"].values())
    per_step = 1 if metrics["settings"]["gradient"] == "pcgrad" else len(MULTITASK_TASKS)
    assert metrics["steps"] == 2 * batches * per_step
    assert (
        set(metrics["examples_seen"]) == set(MULTITASK_TASKS)
        and min(metrics["examples_seen"].values()) >= 2 * 18
    )
    # The training loss every LOSS_LOG_STEPS steps: here an epoch is shorter than one
    # window, so each epoch's one row is that epoch's mean loss, as the history has it.
    steps = pd.read_csv(tmp_path / "metrics" / f"{config}-steps.csv")
    assert metrics["steps"] // 2 < LOSS_LOG_STEPS
    assert steps.epoch.tolist() == [1, 2] and steps.step.tolist() == [metrics["steps"] // 2, metrics["steps"]]
    for task in MULTITASK_TASKS:
        column = f"train_loss_{task}"
        assert steps[column].tolist() == pytest.approx(trained[column].tolist(), abs=1e-4), task
    for task in MULTITASK_TASKS:
        assert (tmp_path / "pred" / config / f"{task}-dev-out.csv").is_file()
    assert not (tmp_path / "pred" / config / "quora-test-out.csv").exists()
    assert (
        (tmp_path / "pred" / config / "sts-test-out.csv")
        .read_text()
        .startswith("id \t Predicted_Similiarity")
    )


def test_config_overrides_only_what_differs(tiny_params):
    base = params_module.multitask_settings(tiny_params, "baseline")
    best = params_module.multitask_settings(tiny_params, "best")
    assert (base.optimizer, base.gradient, base.smart) == ("adamw", "round-robin", None)
    assert (best.optimizer, best.gradient, best.paraphrase_head) == ("adamaxw", "pcgrad", "cross-encoder")
    assert best.smart.beta == 0.99 and best.smart.epsilon == 1e-5
    tiny_params["optimizer"] = "adamaxw"  # what `dvc exp run -S optimizer=adamaxw` does
    switched = params_module.multitask_settings(tiny_params, "baseline")
    # The learning rate, schedule and weight decay come with the optimizer.
    adamaxw = tiny_params["scales"]["cpu"]["multitask"]["optimizers"]["adamaxw"]
    assert (switched.optimizer, switched.lr_schedule, switched.lr_gamma) == (
        "adamaxw",
        adamaxw["lr_schedule"],
        adamaxw["lr_gamma"],
    )
    tiny_params["configs"]["baseline"] = {"gradient": "gradnorm"}
    with pytest.raises(
        params_module.ParamsError, match=r"configs.baseline.gradient = 'gradnorm' is not one of"
    ):
        validate(tiny_params)


def test_non_finite_loss_names_step_task_and_examples(tokenized, tiny_params):
    from minbert.train.loop import NonFiniteLoss
    from minbert.train.multitask import train_multitask

    settings = params_module.multitask_settings(tiny_params, "baseline")
    tables = _train_and_dev(tokenized)
    # A NaN label in STS only: the error must name that task and its batch's ids
    # (round-robin: step 0 trains SST, step 1 Quora, step 2 STS).
    tables["sts", "train"].labels = np.full(len(tables["sts", "train"]), np.nan)
    with pytest.raises(NonFiniteLoss, match=r"epoch 1, step 2, task sts; batch example ids: train"):
        train_multitask(
            settings, BertModel.from_pretrained(tiny_params["checkpoint"]), tables, torch.device("cpu")
        )


@pytest.mark.parametrize("config", ["baseline", "best"])  # best: SMART + PCGrad
def test_an_observer_sees_every_task_objective_and_epoch_without_changing_the_run(
    tokenized, tiny_params, config
):
    from minbert.train.multitask import train_multitask
    from minbert.train.multitask_step import MultitaskObserver

    settings = params_module.multitask_settings(tiny_params, config)
    tables = _train_and_dev(tokenized)

    class Watch(MultitaskObserver):
        def __init__(self):
            self.objectives, self.epochs = [], []

        def objective(self, task, terms, model):
            # Before the backward pass: every term still holds its graph.
            assert terms.objective.requires_grad and terms.loss.requires_grad
            expected = terms.loss
            if settings.smart is not None:
                smart = settings.smart
                expected = terms.loss + smart.lambda_s * terms.adversarial + smart.mu * terms.bregman
            self.objectives.append((task, float(terms.objective), float(expected)))

        def epoch(self, scores, model, teacher):
            self.epochs.append((scores.epoch, scores.validation[SELECTION] is not None, teacher is not None))

    def run(observer=None):
        encoder = BertModel.from_pretrained(tiny_params["checkpoint"])
        return train_multitask(settings, encoder, tables, torch.device("cpu"), observer=observer)

    watch = Watch()
    watched, plain = run(watch), run()
    assert watch.epochs == [(e, True, settings.smart is not None) for e in range(settings.epochs + 1)]
    seen = {t: sum(task == t for task, _, _ in watch.objectives) for t in MULTITASK_TASKS}
    steps = watched.optimizer_steps
    assert seen == dict.fromkeys(MULTITASK_TASKS, steps // (3 if settings.gradient == "round-robin" else 1))
    assert all(got == pytest.approx(expected, rel=1e-6) for _, got, expected in watch.objectives)
    # Watching changes nothing: the same history, to the last digit.
    assert watched.history == plain.history


@pytest.mark.slow
@pytest.mark.parametrize("config", ["baseline", "best"])  # best: SMART's forward-mode ascent
def test_compile_option_compiles_layers_and_keeps_results(tokenized, tiny_params, config):
    import dataclasses

    from minbert.train.multitask import train_multitask

    settings = params_module.multitask_settings(tiny_params, config)
    tables = _train_and_dev(tokenized)
    plain = train_multitask(
        settings, BertModel.from_pretrained(tiny_params["checkpoint"]), tables, torch.device("cpu")
    )
    encoder = BertModel.from_pretrained(tiny_params["checkpoint"])
    # "aot_eager" runs the captured graphs through AOTAutograd, as the default backend
    # does, without generating code: the plumbing is tested without a C++ compiler (and
    # SMART's forward-mode ascent fails in it unless the layers run eagerly there); the
    # numbers must not change.
    compiled = train_multitask(
        dataclasses.replace(settings, compile=True),
        encoder,
        tables,
        torch.device("cpu"),
        compile_options={"backend": "aot_eager"},
    )
    assert all(layer._compiled_call_impl is not None for layer in encoder.encoder.layer)
    assert np.allclose(
        pd.DataFrame([e.row() for e in compiled.history]).astype(float).values,
        pd.DataFrame([e.row() for e in plain.history]).astype(float).values,
        atol=1e-3,
        equal_nan=True,
    )


@pytest.mark.slow
def test_same_seed_gives_identical_metrics_files(tmp_path, tokenized, tiny_params):
    for run in ("a", "b"):
        run_in(tmp_path / run, tiny_params, "best", tokenized)
    for name in ("best.json", "best-run.json", "best-history.csv", "best-conflicts.csv"):
        assert (tmp_path / "a" / "metrics" / name).read_bytes() == (
            tmp_path / "b" / "metrics" / name
        ).read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("config", ["baseline", "best"])  # siamese heads; cross-encoder + SMART
def test_saved_model_reproduces_the_stage_predictions(tmp_path, tokenized, tiny_params, config):
    """The fine-tuned model the stage writes, loaded back, predicts the dev sets exactly as
    the stage's prediction files say; its encoder loads into transformers.BertModel."""
    from transformers import BertModel as HFBertModel

    from minbert.data.predictions import read_predictions
    from minbert.evaluate.multitask import evaluate_multitask
    from minbert.model.multitask import load_multitask

    metrics = run_in(tmp_path, tiny_params, config, tokenized, models=tmp_path / "models")
    directory = tmp_path / "models" / config
    assert {p.name for p in directory.iterdir()} == {
        "config.json",
        "model.safetensors",
        "vocab.txt",
        "heads.safetensors",
        "minbert.json",
        "README.md",
        "training-ids.json.gz",
    }
    # The rows it learned from (the heads' warm-up read every row outside validation), so
    # that scoring the model on them can be caught; validation rows apart.
    import gzip

    learned = json.loads(gzip.decompress((directory / "training-ids.json.gz").read_bytes()))["tasks"]
    train_ids = TokenizedTable.read(tokenized / "tok" / "quora-train.parquet").ids
    assert sorted(learned["quora"]["trained"] + learned["quora"]["validation"]) == sorted(train_ids)
    assert not set(learned["quora"]["trained"]) & set(learned["quora"]["validation"])
    model, info = load_multitask(directory)
    assert info["dev"]["average"] == metrics["average"] and info["best_epoch"] == metrics["epoch"]
    # The model card: its dev scores with intervals, as the metrics file has them.
    card = (directory / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: minbert") and f"`multitask@{config}`" in card
    assert f"| Average | {metrics['average']:.4f} | [" in card and f"minbert predict {directory}" in card
    assert info["max_length"]["sst"] == tiny_params["scales"]["cpu"]["max_length"]["sst"]
    tables = {t: TokenizedTable.read(tokenized / "tok" / f"{t}-dev.parquet") for t in MULTITASK_TASKS}
    data = {t: TaskData(t, table, model.is_siamese(t)) for t, table in tables.items()}
    scores, predictions = evaluate_multitask(model, data, 7, torch.device("cpu"))
    for task in MULTITASK_TASKS:
        written = read_predictions(tmp_path / "pred" / config / f"{task}-dev-out.csv")
        ours = dict(zip(tables[task].ids, predictions[task], strict=True))
        if task == "sts":
            assert {i: f"{v:.3f}" for i, v in ours.items()} == written
        else:
            assert {i: str(int(v)) for i, v in ours.items()} == written
    hf, loading = HFBertModel.from_pretrained(directory, output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    # The same weights: the Hugging Face encoder's final states equal ours.
    ids = torch.tensor([[2, 2023, 2003, 1037, 3231, 3]])
    ours = model.encoder(ids).last_hidden_state
    torch.testing.assert_close(hf(ids).last_hidden_state, ours, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head", ["siamese-concat", "siamese-cosine"])
def test_siamese_scoring_encodes_each_distinct_sentence_once_and_answers_as_the_pairs_do(
    tokenized, tiny_checkpoint, head
):
    from minbert.data.multitask import TaskData
    from minbert.evaluate.multitask import distinct_sentences, task_output
    from minbert.model.multitask import MultitaskBert

    torch.manual_seed(0)
    model = MultitaskBert(BertModel.from_pretrained(tiny_checkpoint), "siamese-concat", head, 0.0).eval()
    table = _train_and_dev(tokenized)["sts", "dev"]
    d = TaskData("sts", table, siamese=True)
    sentences, first, second = distinct_sentences(d)
    seqs = table.sequences
    for i in range(len(d)):  # each pair's sentences, found among the distinct ones
        assert np.array_equal(sentences[first[i]], seqs["input_ids_1"][i])
        assert np.array_equal(sentences[second[i]], seqs["input_ids_2"][i])
    keys = {np.asarray(sentences[k]).tobytes() for k in range(len(sentences))}
    assert len(keys) == len(sentences) <= 2 * len(d)  # none twice
    with torch.inference_mode():
        pairs = model("sts", d.batch(np.arange(len(d))))  # both sentences of every pair at once
        one_by_one = task_output(model, "sts", d, 5, torch.device("cpu"))
    torch.testing.assert_close(one_by_one, pairs, rtol=1e-5, atol=1e-5)
