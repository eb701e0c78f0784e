"""SMART regularisation: divergences, the adversarial ascent, the momentum teacher."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY
from torch import nn

from minbert.model.bert import BertModel
from minbert.settings import PROJECTIONS, SmartSettings
from minbert.train.smart import (
    KINDS,
    EmaTeacher,
    adversarial_perturbation,
    ascent_gradient,
    bregman_loss,
    divergence,
    initial_noise,
    project,
    smoothness_terms,
)

BATCH, SEQ, HIDDEN = 4, 5, 8
OUTPUTS = {"multiclass": 3, "binary": 1, "regression": 1}


class ToyEncoder(nn.Module):
    """A small non-linear map from an embedding batch to one prediction per example."""

    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.layer = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, outputs)

    def forward(self, embedded: torch.Tensor) -> torch.Tensor:
        out = self.head(torch.tanh(self.layer(embedded)).mean(dim=1))
        # Binary and regression predictions are one number per example.
        return out.squeeze(-1) if out.shape[-1] == 1 else out


def toy(kind: str, seed: int = 0) -> tuple[ToyEncoder, torch.Tensor]:
    torch.manual_seed(seed)
    model = ToyEncoder(OUTPUTS[kind])
    # Larger weights than the default init, so predictions vary visibly with the input.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model, torch.randn(BATCH, SEQ, HIDDEN)


# ------------------------------------------------------------------- settings


def test_defaults_are_the_papers_where_it_gives_them():
    s = SmartSettings()
    assert (s.epsilon, s.noise_std, s.step_size, s.steps) == (1e-5, 1e-5, 1e-3, 1)
    assert (s.lambda_s, s.mu, s.beta) == (1.0, 1.0, 0.99)
    # Where the paper is silent: the reference code's per-token geometry at a hundredth of its
    # size, the clean pass's dropout masks (docs/smart.md says why).
    assert (s.projection, s.token_norm, s.dropout_masks) == ("token", 0.01, "shared")


# ----------------------------------------------------------------- divergence


@pytest.mark.parametrize("kind", KINDS)
def test_divergence_zero_for_identical_and_symmetric(kind):
    torch.manual_seed(1)
    shape = (6, 4) if kind == "multiclass" else (6,)
    a, b = torch.randn(shape) * 3, torch.randn(shape) * 3
    assert divergence(a, a, kind).item() == 0.0
    assert divergence(a, b, kind).item() > 0
    torch.testing.assert_close(divergence(a, b, kind), divergence(b, a, kind))


def test_multiclass_matches_hand_computation():
    # p = softmax([0, ln 3]) = (1/4, 3/4); q = softmax([0, 0]) = (1/2, 1/2).
    a = torch.tensor([[0.0, math.log(3.0)], [1.0, 2.0]])
    b = torch.tensor([[0.0, 0.0], [1.0, 2.0]])  # second example: no divergence
    kl_pq = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    kl_qp = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    expected = (kl_pq + kl_qp) / 2  # mean over the batch of two
    assert divergence(a, b, "multiclass").item() == pytest.approx(expected, rel=1e-6)


def test_binary_is_two_class_softmax():
    torch.manual_seed(2)
    a, b = torch.randn(7) * 4, torch.randn(7) * 4
    # sigmoid(z) is softmax([0, z])[1]: the same two-class distribution.
    two_class = divergence(
        torch.stack([torch.zeros(7), a], dim=-1),
        torch.stack([torch.zeros(7), b], dim=-1),
        "multiclass",
    )
    torch.testing.assert_close(divergence(a, b, "binary"), two_class)
    # A trailing singleton dimension is the same thing.
    torch.testing.assert_close(divergence(a[:, None], b[:, None], "binary"), two_class)


def test_binary_is_finite_for_extreme_logits():
    a, b = torch.tensor([80.0, -80.0]), torch.tensor([-80.0, 80.0])
    assert torch.isfinite(divergence(a, b, "binary"))
    assert torch.isfinite(
        divergence(
            a[:, None] * torch.tensor([1.0, -1.0]), b[:, None] * torch.tensor([1.0, -1.0]), "multiclass"
        )
    )


def test_regression_is_mse():
    a, b = torch.tensor([1.0, 2.0, 4.5]), torch.tensor([0.0, 2.5, 1.5])
    torch.testing.assert_close(divergence(a, b, "regression"), F.mse_loss(a, b))
    assert divergence(a, b, "regression").item() == pytest.approx((1 + 0.25 + 9) / 3)


def test_divergence_works_in_float32():
    a = torch.randn(3, 4).bfloat16()
    out = divergence(a, a.flip(0), "multiclass")
    assert out.dtype == torch.float32


def test_divergence_rejects_unknown_kind_and_mismatched_shapes():
    with pytest.raises(ValueError, match="kind"):
        divergence(torch.zeros(2), torch.zeros(2), "ordinal")
    with pytest.raises(ValueError, match="shapes"):
        divergence(torch.zeros(2, 3), torch.zeros(2, 2), "multiclass")


# ----------------------------------------------------------- adversarial ascent


@pytest.mark.parametrize("steps", [1, 2, 5])
@pytest.mark.parametrize("epsilon, step_size", [(1e-5, 1e-3), (1e-2, 0.5), (1e-3, 1e-3)])
def test_perturbation_stays_in_its_ball(steps, epsilon, step_size):
    model, embedded = toy("multiclass")
    settings = SmartSettings(
        epsilon=epsilon, noise_std=epsilon, step_size=step_size, steps=steps, projection="ball"
    )
    noise = adversarial_perturbation(model, embedded, "multiclass", settings)[0]
    assert noise.shape == embedded.shape
    assert noise.abs().max().item() <= epsilon * (1 + 1e-6)
    # A step larger than the ball pushes most coordinates to its surface.
    if step_size > epsilon:
        assert (noise.abs() >= epsilon * (1 - 1e-6)).float().mean() > 0.5


@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_constant_model_has_zero_smoothness_loss(kind, projection):
    torch.manual_seed(3)
    constant = torch.randn(BATCH, OUTPUTS[kind]).squeeze(-1)
    weight = nn.Parameter(torch.zeros(HIDDEN))
    embedded = torch.randn(BATCH, SEQ, HIDDEN)
    settings = SmartSettings(epsilon=0.1, noise_std=0.1, step_size=0.1, steps=2, projection=projection)

    def copies(e: torch.Tensor) -> torch.Tensor:  # the constant, once per copy of the batch
        return torch.cat([constant] * (e.shape[0] // BATCH))

    forward_fns = [
        copies,  # ignores its input entirely
        lambda e: copies(e) + 0 * weight.sum(),  # a graph, but none to the input
        lambda e: copies(e) + 0 * (e * weight).sum(),  # uses the input: a zero gradient
    ]
    for fn in forward_fns:
        noise, _ = adversarial_perturbation(fn, embedded, kind, settings)
        assert torch.isfinite(noise).all()
        clean, loss, control = smoothness_terms(fn, embedded, kind, settings)
        assert loss.dim() == 0 and clean.shape == constant.shape
        assert abs(loss.item()) < 1e-12 and control.item() == 0.0


@pytest.mark.parametrize(
    "settings",
    [
        SmartSettings(epsilon=0.05, noise_std=0.01, step_size=0.02, steps=3, projection="ball"),
        # The paper's literal ball: tiny divergences, but float32 still resolves them.
        SmartSettings(projection="ball"),
        SmartSettings(),  # the default: each token's perturbation of infinity norm 1
        SmartSettings(token_norm=0.05, steps=3, step_size=0.01),
    ],
    ids=["wide-ball", "paper-ball", "token", "small-token"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_ascent_increases_the_divergence(kind, settings):
    model, embedded = toy(kind)
    clean = model(embedded).detach()
    start = initial_noise(embedded, settings.noise_std, torch.Generator().manual_seed(7))
    found, _ = adversarial_perturbation(
        model, embedded, kind, settings, generator=torch.Generator().manual_seed(7)
    )
    with torch.no_grad():
        at_start = divergence(model(embedded + start), clean, kind).item()
        at_found = divergence(model(embedded + found), clean, kind).item()
        # Random points of the same set as a baseline (corners of the ball, or random
        # directions of the same size per token): the ascent beats the best of them.
        at_random = max(
            divergence(
                model(embedded + project(torch.randn(embedded.shape) * 1e3, settings)), clean, kind
            ).item()
            for _ in range(5)
        )
    assert at_found > 2 * at_start
    assert at_found > at_random


class DeepToy(nn.Module):
    """Residual tanh layers: enough float32 rounding to show in an output change of 1e-5."""

    def __init__(self, outputs: int, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, outputs)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            e = torch.tanh(layer(e)) + e
        out = self.head(e.mean(dim=1))
        return out.squeeze(-1) if out.shape[-1] == 1 else out


def _float64_divergence(a: torch.Tensor, b: torch.Tensor, kind: str) -> torch.Tensor:
    """``divergence`` without its cast to float32: the reference's arithmetic."""
    if kind == "multiclass":
        log_p, log_q = a.log_softmax(-1), b.log_softmax(-1)
        return ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(-1).mean()
    if kind == "binary":
        return ((a.sigmoid() - b.sigmoid()) * (a - b)).mean()
    return (a - b).square().mean()


@pytest.mark.parametrize("kind", KINDS)
def test_the_ascent_direction_is_float32_accurate_where_differencing_two_passes_is_not(kind):
    """SMART's ascent starts 1e-5 from the clean input, where the divergence's gradient
    comes from an output change 1e-5 the output's size. Differencing two float32 passes
    leaves 5-10% of that gradient to rounding here (7-30% on all-MiniLM-L6-v2), digits that
    another CPU's kernels round otherwise, so runs diverged between machines;
    ``ascent_gradient`` (a forward-mode derivative, no difference) keeps float32's own error."""
    torch.manual_seed(0)
    model = DeepToy({"multiclass": 5, "binary": 1, "regression": 1}[kind])
    reference_model = copy.deepcopy(model).double()
    embedded = torch.randn(8, 12, 64) * 2
    noise = initial_noise(embedded, 1e-5, torch.Generator().manual_seed(1))

    start = noise.double().requires_grad_(True)
    clean = reference_model(embedded.double()).detach()
    (reference,) = torch.autograd.grad(
        _float64_divergence(reference_model(embedded.double() + start), clean, kind), start
    )

    def error(grad: torch.Tensor) -> float:
        return ((grad.double() - reference).norm() / reference.norm()).item()

    found, _ = ascent_gradient(model, embedded, noise, kind, masks=None)
    assert error(found) < 1e-4
    # The control: the same gradient by differencing two float32 passes.
    moved = noise.clone().requires_grad_(True)
    (differenced,) = torch.autograd.grad(
        divergence(model(embedded + moved), model(embedded).detach(), kind), moved
    )
    assert error(differenced) > 1e-2


def test_generator_makes_the_perturbation_reproducible():
    model, embedded = toy("multiclass")
    settings = SmartSettings(epsilon=0.05, noise_std=0.01, step_size=0.02)
    first, _ = adversarial_perturbation(
        model, embedded, "multiclass", settings, torch.Generator().manual_seed(0)
    )
    second, _ = adversarial_perturbation(
        model, embedded, "multiclass", settings, torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_smoothness_loss_trains_the_model_but_the_ascent_leaves_no_grad():
    torch.manual_seed(4)
    config = dataclasses.replace(TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    bert = BertModel(config)
    head = nn.Linear(32, 3)
    input_ids = torch.randint(1, config.vocab_size, (3, 6))
    attention_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0]])

    def forward_fn(e: torch.Tensor) -> torch.Tensor:  # any number of stacked copies
        return head(bert.encode(e, attention_mask.repeat(e.shape[0] // 3, 1)).pooler_output)

    embedded = bert.embed(input_ids)
    settings = SmartSettings(epsilon=1e-2, noise_std=1e-2, step_size=1e-1, steps=2)
    clean, loss, _ = smoothness_terms(forward_fn, embedded, "multiclass", settings)
    clean.retain_grad()
    torch.testing.assert_close(clean, forward_fn(embedded))
    params = list(bert.named_parameters()) + list(head.named_parameters())
    assert all(p.grad is None for _, p in params), "the ascent wrote to a parameter's .grad"

    loss.backward()
    grads = dict(params)
    for name in ("weight", "bias"):  # the head
        assert grads[name].grad is not None and grads[name].grad.abs().sum() > 0
    for name in (
        "encoder.layer.0.attention.self.query.weight",
        "pooler.dense.weight",
        "embeddings.word_embeddings.weight",
    ):  # through `embedded` too
        assert grads[name].grad is not None and grads[name].grad.abs().sum() > 0, name
    # The clean side is not detached: gradient flows through both predictions.
    assert clean.grad is not None and clean.grad.abs().sum() > 0


# ------------------------------------------------------------------- teacher


class WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.register_buffer("count", torch.zeros(()))


def test_teacher_is_an_ema_of_the_model():
    model = WithBuffer()
    with torch.no_grad():
        # Dyadic values and beta: every product and sum below is exact in float32.
        model.linear.weight.copy_(torch.tensor([[1.0, -2.0], [0.5, 4.0]]))
        model.linear.bias.copy_(torch.tensor([0.25, -1.0]))
    model.linear.weight.grad = torch.ones(2, 2)  # a stale .grad must not be copied
    beta = 0.75
    teacher = EmaTeacher(model, beta=beta)
    assert all(not p.requires_grad and p.grad is None for p in teacher.module.parameters())
    assert not teacher.module.training
    old = [p.clone() for p in teacher.module.parameters()]

    with torch.no_grad():
        model.linear.weight.copy_(torch.tensor([[3.0, 2.0], [-0.5, 0.0]]))
        model.linear.bias.copy_(torch.tensor([1.25, 7.0]))
        model.count.fill_(5.0)
    # A separate copy: changing the model does not reach the teacher before update().
    for p, o in zip(teacher.module.parameters(), old):
        assert torch.equal(p, o)
    assert teacher.module.count.item() == 0.0

    teacher.update(model)
    for p, o, new in zip(teacher.module.parameters(), old, model.parameters()):
        assert torch.equal(p, beta * o + (1 - beta) * new.detach())
    assert teacher.module.count.item() == 5.0
    assert all(p.requires_grad for p in model.parameters())


def test_teacher_update_with_the_papers_beta():
    torch.manual_seed(5)
    model = nn.Linear(3, 2)
    teacher = EmaTeacher(model, beta=0.99)
    old = [p.clone() for p in teacher.module.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    teacher.update(model)
    for p, o, new in zip(teacher.module.parameters(), old, model.parameters()):
        torch.testing.assert_close(p, 0.99 * o + 0.01 * new.detach(), rtol=0, atol=1e-7)


def test_teacher_rejects_a_different_model():
    teacher = EmaTeacher(nn.Linear(2, 2), beta=0.5)
    with pytest.raises(ValueError, match="parameters"):
        teacher.update(nn.Sequential(nn.Linear(2, 2)))


# ------------------------------------------------------------------- Bregman


@pytest.mark.parametrize("kind", KINDS)
def test_bregman_loss_zero_at_teacher_and_no_gradient_into_it(kind):
    torch.manual_seed(6)
    shape = (5, 3) if kind == "multiclass" else (5,)
    student = torch.randn(shape, requires_grad=True)
    teacher = torch.randn(shape, requires_grad=True)  # as if it had a graph
    assert bregman_loss(student, student.detach().clone(), kind).item() == 0.0

    loss = bregman_loss(student, teacher, kind)
    assert loss.item() > 0
    loss.backward()
    assert teacher.grad is None
    assert student.grad is not None and student.grad.abs().sum() > 0
