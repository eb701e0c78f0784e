"""Optimizers and schedules."""

import math

import pytest
import torch

from minbert.train.optim import AdamaxW, build_optimizer, build_scheduler, parameter_groups


def test_adamaxw_matches_hand_computed_steps():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    opt = AdamaxW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    grads = [torch.tensor([0.5, -1.0, 0.0]), torch.tensor([-0.2, 3.0, 1.0])]
    # By hand, following Kingma & Ba (2015) Alg. 2 with decoupled decay.
    x = [1.0, -2.0, 0.5]
    m = [0.0, 0.0, 0.0]
    u = [0.0, 0.0, 0.0]
    for t, g in enumerate(grads, start=1):
        p.grad = g.clone()
        opt.step()
        for i in range(3):
            x[i] *= 1 - 0.1 * 0.1
            m[i] = 0.9 * m[i] + 0.1 * g[i].item()
            u[i] = max(0.99 * u[i], abs(g[i].item()) + 1e-8)
            x[i] -= 0.1 / (1 - 0.9**t) * m[i] / u[i]
        assert p.tolist() == pytest.approx(x, abs=1e-6)


def test_first_step_is_lr_times_sign():
    # With no decay, Adamax's first step moves every coordinate by lr * sign(g).
    p = torch.nn.Parameter(torch.tensor([3.0, -1.0]))
    opt = AdamaxW([p], lr=0.01, weight_decay=0.0)
    p.grad = torch.tensor([2.0, -0.001])
    opt.step()
    assert p.tolist() == pytest.approx([2.99, -0.99], abs=1e-6)


def test_registries_reject_unknown_names():
    params = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match=r"optimizer 'sgd' is not one of \['adamaxw', 'adamw'\]"):
        build_optimizer("sgd", params, lr=1e-3, weight_decay=0)
    opt = build_optimizer("adamw", params, lr=1.0, weight_decay=0)
    with pytest.raises(ValueError, match="lr_schedule 'cosine'"):
        build_scheduler("cosine", opt, gamma=0.9)


def test_exponential_schedule_decays_per_epoch():
    params = torch.nn.Linear(2, 1)
    opt = build_optimizer("adamaxw", params, lr=1.0, weight_decay=0)
    sched = build_scheduler("exponential", opt, gamma=0.9)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1.0, 0.9, 0.81])
    assert not math.isnan(lrs[-1])


def test_per_step_exponential_decays_every_step_and_ends_each_epoch_where_the_per_epoch_one_does():
    from minbert.train.optim import Schedule

    params = torch.nn.Linear(2, 1)
    opt = build_optimizer("adamaxw", params, lr=1.0, weight_decay=0)
    schedule = Schedule("exponential-per-step", opt, gamma=0.9, steps_per_epoch=4)
    applied = []
    for _ in range(2):
        for _ in range(4):
            applied.append(opt.param_groups[0]["lr"])
            opt.step()
            schedule.after_step()
        schedule.after_epoch()  # a no-op for a per-step schedule
    assert applied == pytest.approx([0.9 ** (s / 4) for s in range(8)])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.81)
    per_epoch = Schedule("exponential", build_optimizer("adamaxw", params, lr=1.0, weight_decay=0), 0.9, 4)
    per_epoch.after_step()  # a no-op for a per-epoch schedule
    assert per_epoch.scheduler.get_last_lr()[0] == 1.0


def test_weight_decay_spares_biases_and_layer_norms():
    """BERT's parameter groups: matrices and embeddings decay, 1-D parameters do not."""
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    model[0].weight.requires_grad_(True)
    groups = parameter_groups(model.named_parameters(), 0.01)
    decayed = {id(p) for g in groups if g["weight_decay"] == 0.01 for p in g["params"]}
    spared = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert decayed == {id(model[0].weight), id(model[1].weight)}
    assert spared == {id(model[1].bias), id(model[2].weight), id(model[2].bias)}
    # One AdamW step with a zero gradient: only the decayed parameters shrink.
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer("adamw", model, lr=0.1, weight_decay=0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in model.named_parameters():
        changed = not torch.equal(p.detach(), before[name])
        assert changed == (p.ndim >= 2 and bool(before[name].abs().sum() > 0)), name
    model[1].weight.requires_grad_(False)  # frozen: in no group at all
    assert id(model[1].weight) not in {
        id(p) for g in parameter_groups(model.named_parameters(), 0.01) for p in g["params"]
    }
