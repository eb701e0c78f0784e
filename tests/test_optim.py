"""Optimizers and schedules."""

import math

import pytest
import torch

from minbert.train.optim import AdamaxW, build_optimizer, build_scheduler


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
    params = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(ValueError, match=r"optimizer 'sgd' is not one of \['adamaxw', 'adamw'\]"):
        build_optimizer("sgd", params, lr=1e-3, weight_decay=0)
    opt = build_optimizer("adamw", params, lr=1.0, weight_decay=0)
    with pytest.raises(ValueError, match="lr_schedule 'cosine'"):
        build_scheduler("cosine", opt, gamma=0.9)


def test_exponential_schedule_decays_per_epoch():
    params = [torch.nn.Parameter(torch.zeros(1))]
    opt = build_optimizer("adamaxw", params, lr=1.0, weight_decay=0)
    sched = build_scheduler("exponential", opt, gamma=0.9)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1.0, 0.9, 0.81])
    assert not math.isnan(lrs[-1])
