"""Cost of PCGrad and SMART per multitask training step, relative to a plain step.

One step of multitask training (``minbert.train.multitask_step.MultitaskStep``, the
pipeline's own step) takes one batch of each of SST, Quora and STS at the
configuration's batch sizes (default ``baseline`` at the ``cpu`` scale, siamese
pair heads) and is run four ways, interleaved on the same model:

* ``plain``: one batch of every task, the sum of the three losses, one backward (``summed``);
* ``pcgrad``: ``PCGrad`` (one backward per task, gradient surgery);
* ``smart``: ``summed`` with SMART (SMART settings from params.yaml,
  ``--smart-steps`` ascent steps, default 1) and the teacher update;
* ``pcgrad+smart``: both.

Every variant sees the same cycle of ``--pool`` step batches, drawn once from a
length-bucketed round-robin epoch of the pipeline's tokenised training data
(``data/tokenized/*-train.parquet``); the whole step is timed, as the pipeline runs
it: padding, objectives, backward, clipping, optimizer, teacher update.
"""

from __future__ import annotations

import dataclasses
import itertools

import common
import numpy as np
import torch

TARGETS = {"pcgrad": 1.3, "smart": 2.5}  # step time / plain step time <= this


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", default="baseline", help="a configuration of params.yaml")
    p.add_argument("--scale", default="cpu", help="a scale of params.yaml (sizes)")
    p.add_argument("--pool", type=int, default=8, help="distinct step batches, cycled")
    p.add_argument("--smart-steps", type=int, default=1, help="SMART ascent steps")
    args = p.parse_args()
    common.setup(args, repeats=20, warmup=3)

    from minbert.data.multitask import epoch_steps
    from minbert.settings import SmartSettings

    params, settings = common.multitask_settings(args.config, args.scale)
    smart = dataclasses.replace(
        settings.smart or SmartSettings(**{k: v for k, v in params["smart"].items() if k != "enabled"}),
        steps=args.smart_steps,
    )
    device = torch.device(args.device)
    runner = common.MultitaskRunner(settings, params["checkpoint"], device)
    pool = epoch_steps(
        runner.lengths, settings.batch_size, np.random.default_rng(args.seed), one_task_per_step=False
    )[: args.pool]

    variants = {
        "plain": ("summed", None),
        "pcgrad": ("pcgrad", None),
        "smart": ("summed", smart),
        "pcgrad+smart": ("pcgrad", smart),
    }

    def cycle(gradient: str, smart_settings):  # every variant walks the same batches
        step = runner.step(dataclasses.replace(settings, gradient=gradient, smart=smart_settings))
        batches = itertools.cycle(pool)
        return common.synced(lambda: step(next(batches)), device)

    timings = common.measure(
        {n: cycle(*v) for n, v in variants.items()}, warmup=args.warmup, repeats=args.repeats
    )
    plain = timings["plain"].median
    results = {n: {**t.as_dict(), "ratio_to_plain": t.median / plain} for n, t in timings.items()}
    common.table(
        f"multitask step: {args.config} at scale {args.scale}, batch sizes "
        f"{settings.batch_size}, SMART {args.smart_steps} ascent step(s)",
        ["step", "median ms", "min ms", "x plain"],
        [
            [n, f"{r['median_s'] * 1e3:.1f}", f"{r['min_s'] * 1e3:.1f}", f"{r['ratio_to_plain']:.2f}x"]
            for n, r in results.items()
        ],
    )
    targets = [
        common.target(f"{n} step / plain step", results[n]["ratio_to_plain"], "<=", limit)
        for n, limit in TARGETS.items()
    ]
    common.finish(
        "step_overhead",
        args,
        {
            "config": args.config,
            "scale": args.scale,
            "batch_size": settings.batch_size,
            "heads": {"paraphrase": settings.paraphrase_head, "sts": settings.sts_head},
            "smart_settings": dataclasses.asdict(smart),
            "pool": len(pool),
            "pool_shapes": [{t: list(b.ids.shape) for t, b in runner.batches(step)} for step in pool],
            "variants": results,
        },
        targets,
    )


if __name__ == "__main__":
    main()
