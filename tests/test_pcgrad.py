"""PCGrad (Yu et al., 2020): hand-made gradients checked against the projection formula."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minbert.train.pcgrad import (
    GRAM_CHUNK,
    PCGrad,
    _combine,
    _gram,
    _surgery_weights,
    gram_stats,
    visit_orders,
)


def project_conflicting(grads: list[torch.Tensor], generator: torch.Generator | None = None) -> torch.Tensor:
    """The PCGrad direction of flat per-task gradients, by the training step's own
    functions: the sum of the conflict-projected gradients (orders: one
    ``torch.randperm(k, generator=generator)`` per task, in task order)."""
    rows = torch.stack(grads)
    return _combine(_surgery_weights(_gram(rows), visit_orders(len(grads), generator)), rows)


def conflict_stats(grads: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """``gram_stats`` of flat per-task gradients."""
    return gram_stats(_gram(torch.stack(grads)))


def pcgrad_backward(losses, shared_params, head_params_per_task=None, generator=None) -> dict:
    """One ``PCGrad`` step and the conflict statistics of the original shared gradients."""
    gram = PCGrad(shared_params, head_params_per_task, generator)(losses)
    cosines, conflicts = gram_stats(gram)
    k = len(losses)
    return {"cosines": cosines, "conflicts": conflicts, "pairs": k * (k - 1) // 2}


def t(*values: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def reference_pcgrad(grads: list[torch.Tensor], orders: list[list[int]]) -> torch.Tensor:
    """The paper's Algorithm 1 written out on the vectors, in float64, for given orders."""
    originals = [g.to(torch.float64) for g in grads]
    total = torch.zeros_like(originals[0])
    for i, g_i in enumerate(originals):
        projected = g_i.clone()
        for j in orders[i]:
            if j == i:
                continue
            g_j = originals[j]
            dot = torch.dot(projected, g_j)
            if dot < 0 and torch.dot(g_j, g_j) > 0:
                projected = projected - dot / torch.dot(g_j, g_j) * g_j
        total += projected
    return total


def orders_for_seed(seed: int, k: int) -> list[list[int]]:
    # Documented draw: one torch.randperm(k) per task, in task order.
    gen = torch.Generator().manual_seed(seed)
    return [torch.randperm(k, generator=gen).tolist() for _ in range(k)]


def test_non_conflicting_gradients_are_summed_exactly():
    g1, g2 = t(0.1, 0.7, -0.3), t(0.2, 0.3, 0.4)  # dot = 0.02 + 0.21 - 0.12 > 0
    out = project_conflicting([g1, g2], torch.Generator().manual_seed(0))
    assert torch.equal(out, g1 + g2)


def test_two_conflicting_gradients_match_hand_projection():
    g1, g2 = t(2.0, 0.0), t(-1.0, 1.0)
    # g1.g2 = -2, ||g1||^2 = 4, ||g2||^2 = 2.
    # g1' = g1 - (-2 / 2) g2 = (2, 0) + (-1, 1) = (1, 1);    g1'.g2 = -1 + 1 = 0
    # g2' = g2 - (-2 / 4) g1 = (-1, 1) + (1, 0) = (0, 1);    g2'.g1 = 0
    g1_proj, g2_proj = t(1.0, 1.0), t(0.0, 1.0)
    assert torch.dot(g1_proj, g2) == 0 and torch.dot(g2_proj, g1) == 0
    out = project_conflicting([g1, g2])
    assert out.tolist() == pytest.approx([1.0, 2.0], abs=1e-7)
    assert torch.allclose(out, g1_proj + g2_proj)
    # The order of visits cannot matter with two tasks.
    assert torch.allclose(project_conflicting([g2, g1]), out)


def test_three_tasks_follow_the_seeded_visit_order():
    # g1 conflicts with both g2 and g3; after projecting away one conflict, the
    # other changes, so the result depends on the order the tasks are visited in.
    grads = [t(1.0, 0.0), t(-0.5, 1.0), t(-0.5, -1.0)]
    results = set()
    for seed in range(12):
        out = project_conflicting(grads, torch.Generator().manual_seed(seed))
        expected = reference_pcgrad(grads, orders_for_seed(seed, 3))
        assert out.dtype == torch.float32
        assert torch.allclose(out.double(), expected, atol=1e-6)
        # The same seed gives the same result.
        assert torch.equal(out, project_conflicting(grads, torch.Generator().manual_seed(seed)))
        results.add(tuple(round(v, 5) for v in out.tolist()))
    assert len(results) > 1


def test_three_tasks_by_hand_for_one_order():
    grads = [t(1.0, 0.0), t(-0.5, 1.0), t(-0.5, -1.0)]
    orders = orders_for_seed(0, 3)  # [[2, 0, 1], [2, 1, 0], [1, 2, 0]]
    assert orders == [[2, 0, 1], [2, 1, 0], [1, 2, 0]]
    # Task 0 visits 2 then 1. g0.g2 = -0.5, ||g2||^2 = 1.25:
    #   g0' = (1, 0) + 0.4 (-0.5, -1) = (0.8, -0.4);  g0'.g1 = -0.4 - 0.4 = -0.8:
    #   g0' = (0.8, -0.4) + 0.64 (-0.5, 1) = (0.48, 0.24).
    # Task 1 visits 2 then 0. g1.g2 = 0.25 - 1 = -0.75:
    #   g1' = (-0.5, 1) + 0.6 (-0.5, -1) = (-0.8, 0.4);  g1'.g0 = -0.8:
    #   g1' = (-0.8, 0.4) + 0.8 (1, 0) = (0, 0.4).
    # Task 2 visits 1 then 0. g2.g1 = -0.75:
    #   g2' = (-0.5, -1) + 0.6 (-0.5, 1) = (-0.8, -0.4);  g2'.g0 = -0.8:
    #   g2' = (0, -0.4).
    # Sum: (0.48, 0.24).
    out = project_conflicting(grads, torch.Generator().manual_seed(0))
    assert out.tolist() == pytest.approx([0.48, 0.24], abs=1e-6)


def test_zero_gradient_gives_no_nan():
    grads = [t(0.0, 0.0, 0.0), t(1.0, -2.0, 0.5), t(-1.0, 1.0, 0.0)]
    out = project_conflicting(grads, torch.Generator().manual_seed(1))
    assert torch.isfinite(out).all()
    expected = reference_pcgrad(grads, orders_for_seed(1, 3))
    assert torch.allclose(out.double(), expected, atol=1e-6)
    # All zero: the sum is zero.
    assert torch.equal(project_conflicting([torch.zeros(4), torch.zeros(4)]), torch.zeros(4))


def test_inputs_are_not_modified():
    grads = [t(2.0, 0.0), t(-1.0, 1.0), t(0.5, -3.0)]
    copies = [g.clone() for g in grads]
    project_conflicting(grads, torch.Generator().manual_seed(3))
    conflict_stats(grads)
    assert all(torch.equal(g, c) for g, c in zip(grads, copies))


def test_single_task_is_returned_unchanged():
    g = t(1.0, -2.0)
    out = project_conflicting([g])
    assert torch.equal(out, g) and out is not g


def test_half_precision_keeps_dtype_and_matches_reference():
    grads = [t(2.0, 0.0, 1.0, dtype=torch.float16), t(-1.0, 1.0, -0.5, dtype=torch.float16)]
    out = project_conflicting(grads)
    assert out.dtype == torch.float16
    expected = reference_pcgrad(grads, [[0, 1], [0, 1]])
    assert torch.allclose(out.double(), expected, atol=1e-2)


def test_conflict_stats_cosines_and_count():
    grads = [t(1.0, 0.0), t(0.0, 2.0), t(-3.0, 3.0), t(0.0, 0.0)]
    cos, conflicts = conflict_stats(grads)
    s = 2**-0.5
    expected = torch.tensor(
        [
            [1.0, 0.0, -s, 0.0],
            [0.0, 1.0, s, 0.0],
            [-s, s, 1.0, 0.0],
            [0.0, 0.0, 0.0, 1.0],
        ]
    )
    assert cos.shape == (4, 4) and cos.dtype == torch.float32
    assert torch.allclose(cos, expected, atol=1e-6)
    assert conflicts == 1  # only (g0, g2); orthogonal and zero gradients do not count
    assert conflict_stats([t(1.0, 1.0), t(-1.0, 0.0), t(0.0, -1.0)])[1] == 2


class TwoTaskModel(nn.Module):
    """A shared linear layer and a shared scale used only by task A; one head per task."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 3)
        self.scale_a = nn.Parameter(torch.tensor([1.5, -0.5, 2.0]))
        self.head_a = nn.Linear(3, 1)
        self.head_b = nn.Linear(3, 1)

    def shared_params(self) -> list[nn.Parameter]:
        return [*self.shared.parameters(), self.scale_a]

    def losses(self, x: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor) -> list[torch.Tensor]:
        h = torch.tanh(self.shared(x))
        loss_a = (self.head_a(h * self.scale_a).squeeze(-1) - y_a).pow(2).mean()
        loss_b = (self.head_b(h).squeeze(-1) - y_b).pow(2).mean()
        return [loss_a, loss_b]


def make_problem(seed: int = 0):
    torch.manual_seed(seed)
    model = TwoTaskModel()
    x = torch.randn(8, 4)
    # Opposite targets push the shared layer in opposite directions.
    y_a = x.sum(-1)
    return model, x, y_a, -2 * y_a


def manual_grads(model: TwoTaskModel, x, y_a, y_b, task: int, params) -> list[torch.Tensor]:
    """Plain ``.backward()`` of one task's loss on a fresh forward pass."""
    model.zero_grad(set_to_none=True)
    model.losses(x, y_a, y_b)[task].backward()
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)
    return grads


def flat(tensors) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in tensors])


def test_pcgrad_backward_writes_projected_shared_and_plain_head_grads():
    model, x, y_a, y_b = make_problem()
    shared = model.shared_params()
    heads = [list(model.head_a.parameters()), list(model.head_b.parameters())]
    per_task = [flat(manual_grads(model, x, y_a, y_b, task, shared)) for task in (0, 1)]
    head_a_grads = manual_grads(model, x, y_a, y_b, 0, heads[0])
    head_b_grads = manual_grads(model, x, y_a, y_b, 1, heads[1])

    # A stale gradient must be overwritten, not added to.
    for p in model.parameters():
        p.grad = torch.full_like(p, 100.0)
    stats = pcgrad_backward(
        model.losses(x, y_a, y_b), shared, heads, generator=torch.Generator().manual_seed(0)
    )

    expected_shared = project_conflicting(per_task, torch.Generator().manual_seed(0))
    assert torch.allclose(flat(p.grad for p in shared), expected_shared, atol=1e-6)
    for p, g in zip(heads[0], head_a_grads):
        assert torch.allclose(p.grad, g, atol=1e-6)
    for p, g in zip(heads[1], head_b_grads):
        assert torch.allclose(p.grad, g, atol=1e-6)

    cos, conflicts = conflict_stats(per_task)
    assert stats["pairs"] == 1
    assert stats["conflicts"] == conflicts
    assert torch.allclose(stats["cosines"], cos, atol=1e-6)
    # The problem is built so that the tasks conflict: the surgery did something.
    assert conflicts == 1
    assert not torch.allclose(expected_shared, per_task[0] + per_task[1])


def test_pcgrad_backward_without_heads_and_with_a_graphless_loss():
    # A task whose loss has no graph (e.g. an empty batch) contributes zeros, so
    # the shared gradient is task A's plain gradient.
    model, x, y_a, y_b = make_problem()
    shared = model.shared_params()
    expected = manual_grads(model, x, y_a, y_b, 0, shared)
    stats = pcgrad_backward([model.losses(x, y_a, y_b)[0], torch.tensor(0.5)], shared)
    for p, g in zip(shared, expected):
        assert torch.allclose(p.grad, g, atol=1e-6)
    assert stats["conflicts"] == 0 and model.head_a.weight.grad is None


def test_shared_gradients_are_views_of_one_buffer_reused_every_step():
    model, x, y_a, y_b = make_problem()
    shared = model.shared_params()
    heads = [list(model.head_a.parameters()), list(model.head_b.parameters())]
    pcgrad = PCGrad(shared, heads, torch.Generator().manual_seed(0))
    pcgrad(model.losses(x, y_a, y_b))
    first = [p.grad.clone() for p in shared]
    buffer = pcgrad.combined.untyped_storage().data_ptr()
    assert all(p.grad.untyped_storage().data_ptr() == buffer for p in shared)
    model.zero_grad(set_to_none=True)
    # A second step on other data writes into the same buffer, and says so in .grad.
    pcgrad(model.losses(x * 2, y_a, y_b))
    assert any(not torch.equal(p.grad, g) for p, g in zip(shared, first))
    assert torch.equal(torch.cat([p.grad.reshape(-1) for p in shared]), pcgrad.combined)


def test_gram_matrix_over_many_chunks_is_accurate():
    # Longer than two chunks and not a multiple of one: the chunked products and the
    # rest, against float64.
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(2 * GRAM_CHUNK + 1234, generator=gen) for _ in range(3)]
    grads[1] = grads[1] - 0.5 * grads[0]
    out = project_conflicting(grads, torch.Generator().manual_seed(2))
    expected = reference_pcgrad(grads, orders_for_seed(2, 3))
    # float32 projections of ~1e5-long vectors: a few 1e-6 off float64 (one float32
    # matmul for the Gram matrix was 1e-3 off).
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=5e-6)


def test_loss_and_parameter_validation():
    p = nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="losses"):
        pcgrad_backward([], [p])
    with pytest.raises(ValueError, match="shared parameters"):
        pcgrad_backward([p.sum()], [])
    with pytest.raises(ValueError, match="scalar"):
        pcgrad_backward([p * 2], [p])
    with pytest.raises(ValueError, match="both shared and a task head"):
        pcgrad_backward([p.sum()], [p], [[p]])


@pytest.mark.parametrize("seed", range(5))
def test_random_many_task_gradients_match_the_vector_algorithm(seed):
    # The implementation works on the Gram matrix; the reference projects vectors.
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(5)]
    grads[3] = -grads[0] + 0.1 * grads[3]  # a strong conflict, so that projections chain
    out = project_conflicting(grads, torch.Generator().manual_seed(seed))
    expected = reference_pcgrad(grads, orders_for_seed(seed, 5))
    assert out.dtype == torch.float64
    assert torch.allclose(out, expected, atol=1e-12)


def test_flattened_pcgrad_on_a_bert_encoder_matches_the_vector_algorithm():
    # The three multitask losses of a tiny BERT: PCGrad's flattened step against the
    # paper's algorithm on each task's gradient, in float64, to 1e-6.
    from conftest import TINY
    from test_smart_measured import tiny_batch

    from minbert.model.bert import BertModel
    from minbert.model.multitask import MultitaskBert, task_loss

    torch.manual_seed(4)  # a draw whose task gradients conflict
    # Eval mode: no dropout, so every pass over a batch gives the same gradient.
    model = MultitaskBert(BertModel(TINY), "cross-encoder", "cross-encoder", 0.0, "pooler").eval()
    batches = {task: tiny_batch(task, seed=40 + k) for k, task in enumerate(("sst", "quora", "sts"))}

    def losses():
        return [task_loss(task, model(task, batch), labels) for task, (batch, labels) in batches.items()]

    shared = [p for p in model.encoder.parameters() if p.requires_grad]
    heads = [list(model.heads[t].parameters()) for t in ("sst", "quora", "sts")]
    per_task = []
    for loss in losses():
        model.zero_grad(set_to_none=True)
        loss.backward()
        per_task.append(flat(torch.zeros_like(p) if p.grad is None else p.grad for p in shared))
    model.zero_grad(set_to_none=True)
    stats = pcgrad_backward(losses(), shared, heads, generator=torch.Generator().manual_seed(4))
    expected = reference_pcgrad(per_task, orders_for_seed(4, 3))
    got = flat(p.grad for p in shared).double()
    assert stats["conflicts"] >= 2  # the surgery had something to do
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


def frozen_visit_orders(k: int, generator: torch.Generator | None) -> list[list[int]]:
    """pcgrad._visit_orders as of main 7084fbe, copied unchanged: the reference."""
    device = generator.device if generator is not None else torch.device("cpu")
    return [torch.randperm(k, generator=generator, device=device).tolist() for _ in range(k)]


@torch.no_grad()
def frozen_surgery_weights(gram: torch.Tensor, orders: list[list[int]]) -> torch.Tensor:
    """pcgrad._surgery_weights as of main 7084fbe (host orders), copied unchanged."""
    k = gram.shape[0]
    coef = torch.eye(k, dtype=torch.float64, device=gram.device)
    norm_sq = gram.diagonal()
    zero = gram.new_zeros(())
    for i in range(k):
        for j in orders[i]:
            if j == i:
                continue
            dot = coef[i] @ gram[:, j]
            conflict = (dot < 0) & (norm_sq[j] > 0)
            step = dot / norm_sq[j].clamp_min(torch.finfo(torch.float64).tiny)
            coef[i, j] -= torch.where(conflict, step, zero)
    return coef.sum(0)


def random_task_gradients(gen: torch.Generator) -> list[torch.Tensor]:
    """2 or 3 task gradients of random length and scale, often conflicting, sometimes
    zero or a multiple of another (ties and exact cancellations)."""
    k = int(torch.randint(2, 4, (), generator=gen))
    n = int(torch.randint(1, 40, (), generator=gen))
    scale = 10.0 ** float(torch.empty(()).uniform_(-6, 3, generator=gen))
    grads = [torch.randn(n, generator=gen) * scale for _ in range(k)]
    kind = int(torch.randint(0, 6, (), generator=gen))
    if kind == 0:
        grads[0] = torch.zeros(n)
    elif kind == 1:
        grads[1] = -2.0 * grads[0]
    elif kind == 2:
        grads[-1] = -grads[0] + 0.1 * grads[-1]
    return grads


def test_the_device_surgery_is_the_frozen_host_surgery_to_the_bit():
    """2,000 random gradient sets: the same draws of visit orders (a tensor now, a list
    before), the same weights and the same combined gradient, to the bit."""
    gen = torch.Generator().manual_seed(0)
    conflicts = 0
    for case in range(2000):
        grads = random_task_gradients(gen)
        rows, k = torch.stack(grads), len(grads)
        gram = _gram(rows)
        seed = int(torch.randint(0, 2**31, (), generator=gen))
        orders = visit_orders(k, torch.Generator().manual_seed(seed))
        old_orders = frozen_visit_orders(k, torch.Generator().manual_seed(seed))
        assert orders.tolist() == old_orders and orders.dtype == torch.int64
        new, old = _surgery_weights(gram, orders), frozen_surgery_weights(gram, old_orders)
        assert torch.equal(new, old), (case, new, old)
        assert torch.equal(_combine(new, rows), _combine(old, rows)), case
        conflicts += gram_stats(gram)[1] > 0
    assert conflicts > 500  # the surgery had work to do in many cases


def test_pcgrad_draws_from_its_generator_unless_given_the_orders():
    model, x, y_a, y_b = make_problem()
    shared = model.shared_params()
    drawn = PCGrad(shared, None, torch.Generator().manual_seed(3))
    drawn(model.losses(x, y_a, y_b))
    first = flat(p.grad for p in shared).clone()
    given = PCGrad(shared, None, torch.Generator().manual_seed(99))
    given(model.losses(x, y_a, y_b), visit_orders(2, torch.Generator().manual_seed(3)))
    assert torch.equal(flat(p.grad for p in shared), first)
    # The generator was not drawn from when the orders were given.
    assert torch.equal(given.generator.get_state(), torch.Generator().manual_seed(99).get_state())
