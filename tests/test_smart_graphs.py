"""SMART under CUDA graphs (docs/performance.md, "CUDA graphs"): its dropout masks on a
tape instead of rewound generators, eager training as before to the bit, and steps
replayed from (stand-in) graphs that register SMART's generators."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
import yaml
from capture_stand_in import GeneratorReplays
from conftest import REPO, tiny_multitask_scale
from smart_reference import todays_code
from test_multitask import tiny_tables

from minbert.data.batches import TokenizedTable
from minbert.data.multitask import TaskData
from minbert.model.bert import BertModel
from minbert.model.multitask import MultitaskBert
from minbert.pipeline import params as params_module
from minbert.pipeline.schema import validate
from minbert.tasks import MULTITASK_TASKS
from minbert.train.graphed_step import GraphedStep, compare_with_eager, device_generators, refusal
from minbert.train.multitask_step import MultitaskStep

CONFIGS = ["best", "best-adamw", "best-summed", "best-round-robin"]
SIZES = {"sst": 4, "quora": 3, "sts": 3}


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, tiny_checkpoint):
    return tiny_tables(tmp_path_factory.mktemp("smart-graphs"), tiny_checkpoint)


@pytest.fixture
def tiny_params(tiny_checkpoint):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p.update(checkpoint=str(tiny_checkpoint), device="cpu")
    tiny_multitask_scale(p, epochs=1, batch_size=SIZES, history={"dev": 10, "train": 6})
    return validate(p)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_step(tiny_params, tokenized, config: str, capturable: bool = False, **changes) -> MultitaskStep:
    settings = params_module.multitask_settings(tiny_params, config)
    settings = dataclasses.replace(settings, **changes)
    assert settings.smart is not None and settings.smart.dropout_masks == "shared"
    torch.manual_seed(0)
    encoder = BertModel.from_pretrained(tiny_params["checkpoint"])
    assert encoder.config.hidden_dropout_prob > 0  # every pass draws masks
    model = MultitaskBert(encoder, settings.paraphrase_head, settings.sts_head, 0.1, "mean").train()
    train = {
        t: TaskData(t, TokenizedTable.read(tokenized / "tok" / f"{t}-train.parquet"), model.is_siamese(t))
        for t in MULTITASK_TASKS
    }
    return MultitaskStep(settings, model, train, torch.device("cpu"), capturable=capturable)


def plan(step: MultitaskStep, steps: int, fixed_shapes: bool) -> list[dict[str, np.ndarray]]:
    """Each step's rows: every task (summed, PCGrad) or one in turn (round-robin); with
    ``fixed_shapes`` each batch holds its task's longest row, so that a task's batches
    share one shape (one graph)."""
    rng = np.random.default_rng(0)
    plans = []
    for i in range(steps):
        tasks = MULTITASK_TASKS if step.settings.gradient != "round-robin" else [MULTITASK_TASKS[i % 3]]
        rows = {}
        for t in tasks:
            lengths = step.train[t].lengths
            longest = int(np.argmax(lengths))
            others = rng.permutation([r for r in range(len(lengths)) if r != longest])
            rows[t] = np.array([longest, *others[: SIZES[t] - 1]]) if fixed_shapes else others[: SIZES[t]]
        plans.append(rows)
    return plans


def snapshot(step: MultitaskStep) -> dict[str, list[torch.Tensor]]:
    """What a step leaves behind: weights, the teacher's, the random streams' positions."""
    return {
        "weights": [p.detach().clone() for p in step.model.parameters()],
        "teacher": [p.detach().clone() for p in step.smart.teacher.module.parameters()],
        "streams": [torch.get_rng_state(), *(g.get_state() for g in step.generators)],
    }


def assert_same(a: dict, b: dict, at) -> None:
    for what in a:
        assert len(a[what]) == len(b[what])
        assert all(torch.equal(x, y) for x, y in zip(a[what], b[what])), (at, what)


def train(step_fn, step: MultitaskStep, rows_plan, frozen=False) -> list[tuple[torch.Tensor, dict]]:
    torch.manual_seed(1)
    out = []
    for i, rows in enumerate(rows_plan):
        if frozen:
            with todays_code(step.smart):
                losses = step_fn(rows, 0, i)[0]
        else:
            losses = step_fn(rows, 0, i)[0]
        out.append((losses.clone(), snapshot(step)))
    step.flush()
    return out


@pytest.mark.parametrize("config", CONFIGS)
def test_the_mask_tape_trains_as_todays_rewinding_to_the_bit(tiny_params, tokenized, config):
    """The eager step, the tape's first pass drawing what the rewound generator drew,
    against a frozen copy of the rewinding code (tests/smart_reference.py): after every
    step, the losses, weights, teacher and every random stream's position are equal."""
    reference, tape = make_step(tiny_params, tokenized, config), make_step(tiny_params, tokenized, config)
    rows_plan = plan(reference, 8, fixed_shapes=False)
    expected = train(reference, reference, rows_plan, frozen=True)
    got = train(tape, tape, rows_plan)
    # The reference ran the frozen code, the other the tape, masks recorded.
    assert type(reference.smart.masks).__name__ == "DropoutMasks"
    assert type(tape.smart.masks).__name__ == "MaskTape" and tape.smart.masks.masks
    for i, ((loss_a, state_a), (loss_b, state_b)) in enumerate(zip(expected, got)):
        assert torch.equal(loss_a, loss_b) and loss_a.abs().sum() > 0, (i, loss_a, loss_b)
        assert_same(state_a, state_b, i)


def graph_ready(tiny_params, tokenized, config: str) -> MultitaskStep:
    """``config``'s step as a run that uses graphs builds it: its optimizer capturable, all
    else (SMART, PCGrad or not, dropout) as configured."""
    step = make_step(tiny_params, tokenized, config, capturable=True)
    assert refusal(step) is None
    return step


@pytest.mark.parametrize("left_out", [None, "noise", "dropout"])
@pytest.mark.parametrize("config", CONFIGS)
def test_smart_trains_from_stand_in_graphs_as_eager(tiny_params, tokenized, config, left_out):
    """20 steps from stand-in graphs (a replay reruns the step; an unregistered generator
    replays its capture-time numbers, as a CUDA graph's does) equal the eager step's to
    the bit: losses, weights, teacher, streams. Leave SMART's noise generator, or
    dropout's, unregistered and they differ: registration is what makes it work."""
    eager, base = graph_ready(tiny_params, tokenized, config), graph_ready(tiny_params, tokenized, config)
    rows_plan = plan(eager, 20, fixed_shapes=True)
    expected = train(eager, eager, rows_plan)
    generators = device_generators(base)
    assert len(generators) == 2 and generators[1] is base.smart.generator
    skip = {None: None, "noise": generators[1], "dropout": generators[0]}[left_out]
    replays = GeneratorReplays(generators)

    def capture(fn, registered):
        return replays(fn, [g for g in registered if g is not skip])

    graphed = GraphedStep(base, new_capture=lambda: capture)
    got = train(graphed, base, rows_plan)
    shapes = len({tuple(sorted(rows)) for rows in rows_plan})
    assert replays.captures == len(graphed.graphs) == shapes and graphed.eager_steps == shapes
    same = [
        torch.equal(a[0], b[0]) and all(torch.equal(x, y) for k in a[1] for x, y in zip(a[1][k], b[1][k]))
        for a, b in zip(expected, got)
    ]
    if left_out is None:
        assert all(same), same
    else:
        assert not all(same[-5:]), same


@pytest.mark.parametrize("restored", [True, False])
def test_compare_with_eager_restores_smarts_state(tiny_params, tokenized, restored):
    """The check's three runs each start from one state, SMART's teacher, the generators
    and optimizer state made during the check included: eager agrees with eager to the
    bit, and the step goes on after the check as if it had not run. Without the
    generators restored, two eager runs differ."""
    step = graph_ready(tiny_params, tokenized, "best-summed")
    graphed = GraphedStep(step, new_capture=lambda: GeneratorReplays(device_generators(step)))
    rows_plan = plan(step, 6, fixed_shapes=True)
    graphed(rows_plan[0])  # the optimizer's state exists before the check
    before = snapshot(step)
    optimizer = copy.deepcopy(step.optimizer.state_dict())
    check = compare_with_eager(graphed, rows_plan, generators=None if restored else [])
    if not restored:
        assert check.eager_loss_difference > 0
        return
    assert check.eager_loss_difference == 0 and check.eager_weight_difference == 0
    assert check.loss_difference == 0 and check.weight_difference == 0 and check.passed
    assert_same(before, snapshot(step), "after the check")
    after = step.optimizer.state_dict()
    assert after["param_groups"] == optimizer["param_groups"]
    assert all(
        torch.equal(x, optimizer["state"][k][name])
        for k, s in after["state"].items()
        for name, x in s.items()
    )
