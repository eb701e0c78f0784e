"""Operators dispatched per multitask training step, for each way of stepping.

At all-MiniLM-L6-v2's size a training step holds about a millisecond of GPU
arithmetic, so on a GPU the time of a step is set by how many kernels the host
launches, not by the arithmetic. The number of aten operators a step dispatches is
that count's proxy, and it can be measured on a CPU: each operator the pipeline's
step (``MultitaskStep``) runs below autograd (forward, backward, optimizer, teacher)
is counted with a ``TorchDispatchMode``, averaged over a pool of the same steps a
run would take.

Step modes: ``round-robin`` (one task's batch), ``summed`` and ``pcgrad`` (one batch
of every task), and SMART on round-robin and on PCGrad. Targets: PCGrad at most 1.5x
the operators of the summed step it replaces; SMART at most 2.5x the operators of the
step it wraps.

    python bench/step_ops.py                    # the cross-encoder `best` heads, cpu scale
    python bench/step_ops.py --config baseline  # siamese heads
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import common
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# (mode, the mode it wraps or replaces, at most this many times its operators)
TARGETS = [
    ("pcgrad", "summed", 1.5),
    ("round-robin+smart", "round-robin", 2.5),
    ("pcgrad+smart", "pcgrad", 2.5),
]


class OperatorCount(TorchDispatchMode):
    """Counts every aten operator dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", default="best", help="a configuration of params.yaml (its heads)")
    p.add_argument("--scale", default="cpu", help="a scale of params.yaml (sizes)")
    p.add_argument("--pool", type=int, default=6, help="steps counted per mode")
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=1)

    from minbert.data.multitask import epoch_steps
    from minbert.settings import SmartSettings

    params, settings = common.multitask_settings(args.config, args.scale)
    smart = settings.smart or SmartSettings(**{k: v for k, v in params["smart"].items() if k != "enabled"})
    runner = common.MultitaskRunner(settings, params["checkpoint"], torch.device(args.device))
    pool = args.pool if not args.quick else 2
    rng = np.random.default_rng(args.seed)
    one_task = epoch_steps(runner.lengths, settings.batch_size, rng, one_task_per_step=True)[: 3 * pool]
    all_tasks = epoch_steps(runner.lengths, settings.batch_size, rng, one_task_per_step=False)[:pool]
    modes = {
        "round-robin": ("round-robin", None, one_task),
        "summed": ("summed", None, all_tasks),
        "pcgrad": ("pcgrad", None, all_tasks),
        "round-robin+smart": ("round-robin", smart, one_task),
        "pcgrad+smart": ("pcgrad", smart, all_tasks),
    }
    results = {}
    for name, (gradient, smart_settings, steps) in modes.items():
        step = runner.step(dataclasses.replace(settings, gradient=gradient, smart=smart_settings))
        step(steps[0])  # the optimizer's state is created on its first step: not counted
        counter = OperatorCount()
        with counter:
            for rows in steps:
                step(rows)
        step.flush()
        total = sum(counter.ops.values())
        results[name] = {
            "steps": len(steps),
            "ops_per_step": total / len(steps),
            "top": [{"op": op, "per_step": n / len(steps)} for op, n in counter.ops.most_common(8)],
        }
    common.table(
        f"aten operators per step: {args.config} at scale {args.scale}, batch {settings.batch_size}",
        ["step mode", "steps counted", "ops per step"],
        [[n, r["steps"], f"{r['ops_per_step']:.0f}"] for n, r in results.items()],
    )
    targets = [
        common.target(
            f"{mode} ops / {base} ops",
            results[mode]["ops_per_step"] / results[base]["ops_per_step"],
            "<=",
            limit,
        )
        for mode, base, limit in TARGETS
    ]
    common.finish(
        "step_ops",
        args,
        {
            "config": args.config,
            "scale": args.scale,
            "heads": {"paraphrase": settings.paraphrase_head, "sts": settings.sts_head},
            "modes": results,
        },
        targets,
    )


if __name__ == "__main__":
    main()
