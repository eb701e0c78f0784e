"""AdamaxW's eager step against a frozen copy of the step the committed results were
trained with, and its capturable step (rate and step counts on the device) against the
eager one: equal to the bit."""

from __future__ import annotations

import pytest
import torch

from minbert.train.optim import AdamaxW, Schedule, build_optimizer


class FrozenAdamaxW(torch.optim.Optimizer):
    """AdamaxW.step as of main 7084fbe, copied unchanged: the reference."""

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if not self.state[p]:
                    self.state[p].update(step=0, exp_avg=torch.zeros_like(p), exp_inf=torch.zeros_like(p))
            if not params:
                continue
            states = [self.state[p] for p in params]
            for st in states:
                st["step"] += 1
            grads = [p.grad for p in params]
            m = [st["exp_avg"] for st in states]
            u = [st["exp_inf"] for st in states]
            if wd:
                torch._foreach_mul_(params, 1 - lr * wd)
            torch._foreach_lerp_(m, grads, 1 - beta1)
            torch._foreach_mul_(u, beta2)
            g_abs = torch._foreach_abs(grads)
            torch._foreach_add_(g_abs, eps)
            torch._foreach_maximum_(u, g_abs)
            for step in sorted({st["step"] for st in states}):
                idx = [i for i, st in enumerate(states) if st["step"] == step]
                torch._foreach_addcdiv_(
                    [params[i] for i in idx],
                    [m[i] for i in idx],
                    [u[i] for i in idx],
                    value=-lr / (1 - beta1**step),
                )


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _train(optimizer: torch.optim.Optimizer, model: torch.nn.Module, schedule: str, steps: int = 20):
    """``steps`` steps on fixed random gradients, the rate moved after each by the project's
    schedule; the last layer's bias has no gradient on every third step (its step count
    falls behind the others')."""
    sched = Schedule(schedule, optimizer, gamma=0.5, steps_per_epoch=4)
    gen = torch.Generator().manual_seed(1)
    params = list(model.parameters())
    for t in range(steps):
        for i, p in enumerate(params):
            g = torch.randn(p.shape, generator=gen) * 10.0 ** (i - 2)
            p.grad = None if (i == len(params) - 1 and t % 3 == 1) else g
        optimizer.step()
        sched.after_step()
        if t % 4 == 3:
            sched.after_epoch()
    return sched


def _state(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list:
    out = [p.detach() for p in model.parameters()]
    for p in model.parameters():
        st = optimizer.state[p]
        out += [st["exp_avg"], st["exp_inf"], torch.as_tensor(st["step"], dtype=torch.float64)]
    return out


def _groups(model: torch.nn.Module, lr: float) -> list[dict]:
    # Two groups, one decayed, at different rates (as the encoder and the heads).
    first, second = list(model[0].parameters()), list(model[2].parameters())
    return [{"params": first, "weight_decay": 0.01, "lr": lr}, {"params": second, "weight_decay": 0.0}]


@pytest.mark.parametrize("schedule", ["exponential-per-step", "exponential", "linear-warmup"])
def test_eager_adamaxw_is_the_frozen_step_to_the_bit(schedule):
    a, b = _model(), _model()
    frozen = FrozenAdamaxW(_groups(a, 3e-3), lr=1e-3, weight_decay=0.01)
    eager = AdamaxW(_groups(b, 3e-3), lr=1e-3, weight_decay=0.01)
    _train(frozen, a, schedule)
    _train(eager, b, schedule)
    for x, y in zip(_state(frozen, a), _state(eager, b), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("schedule", ["exponential-per-step", "exponential", "linear-warmup"])
def test_capturable_adamaxw_is_the_eager_step_to_the_bit(schedule):
    a, b = _model(), _model()
    eager = AdamaxW(_groups(a, 3e-3), lr=1e-3, weight_decay=0.01)
    capturable = AdamaxW(_groups(b, 3e-3), lr=1e-3, weight_decay=0.01, capturable=True)
    _train(eager, a, schedule)
    sched = _train(capturable, b, schedule)
    for x, y in zip(_state(eager, a), _state(capturable, b), strict=True):
        assert torch.equal(x, y)
    # The rates stay float64 device tensors, filled in place, equal to the eager floats.
    for ge, gc in zip(eager.param_groups, capturable.param_groups):
        assert torch.is_tensor(gc["lr"]) and gc["lr"].dtype == torch.float64
        assert gc["lr"].item() == ge["lr"]
    assert sched.state_dict()["last_epoch"] > 0
    steps = [capturable.state[p]["step"] for p in b.parameters()]
    assert all(s.dtype == torch.float64 for s in steps) and steps[-1] < steps[0]


def test_capturable_rate_is_read_at_each_step_and_survives_a_reload():
    """A recorded step reads the rate tensor, so a scheduler's fill reaches it; a state
    saved and loaded keeps float64 step counts (PyTorch casts capturable ones to float32)."""
    a, b = _model(), _model()
    eager = build_optimizer("adamaxw", a, lr=1e-3, weight_decay=0.01)
    capturable = build_optimizer("adamaxw", b, lr=1e-3, weight_decay=0.01, capturable=True)
    lr_tensors = [g["lr"] for g in capturable.param_groups]
    _train(eager, a, "exponential-per-step", steps=5)
    _train(capturable, b, "exponential-per-step", steps=5)
    assert all(g["lr"] is t for g, t in zip(capturable.param_groups, lr_tensors))
    reloaded = build_optimizer("adamaxw", b, lr=1e-3, weight_decay=0.01, capturable=True)
    reloaded.load_state_dict(capturable.state_dict())
    for p in b.parameters():
        assert reloaded.state[p]["step"].dtype == torch.float64
    gen = torch.Generator().manual_seed(5)
    for model, opt in ((a, eager), (b, reloaded)):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        gen.manual_seed(5)
        opt.step()
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


def test_build_optimizer_passes_capturable_and_keeps_adamw_fused():
    model = _model()
    for capturable in (False, True):
        adamw = build_optimizer("adamw", model, lr=1e-3, weight_decay=0.01, capturable=capturable)
        assert adamw.defaults["fused"] and adamw.defaults["capturable"] is capturable
        adamaxw = build_optimizer("adamaxw", model, lr=1e-3, weight_decay=0.01, capturable=capturable)
        assert all(g["capturable"] is capturable for g in adamaxw.param_groups)
        assert all(torch.is_tensor(g["lr"]) is capturable for g in adamaxw.param_groups)
