"""One multitask training epoch: length-bucketed batches against random batches.

The pipeline's multitask stage (``minbert.train.multitask``) draws every task's
batches from length buckets (``length_bucketed_batches``) and pads each batch only
to its own longest sequence. This script times one epoch of a configuration
(default ``baseline`` at the ``cpu`` scale of params.yaml: its training subsets,
batch sizes, heads, optimizer, learning rate, gradient mode) twice, identical
except for the batch order:

* ``bucketed``: ``epoch_steps`` as the pipeline calls it;
* ``random``: the same ``epoch_steps`` with each task's passes drawn by
  ``random_batches`` (plain shuffled batches, padded to their longest).

Both variants have the same number of steps (one batch of every task per step,
the epoch as long as the task with the most batches) and run the pipeline's own
step (``MultitaskStep``: batch padding, objectives, backward, clipping,
optimizer), each on a fresh model loaded from the same checkpoint, the repeats
interleaved. The dev evaluation at the end of a pipeline epoch is not timed.
It reads the pipeline's tokenised data, ``data/tokenized/{sst,quora,sts}-train.parquet``
(``dvc repro tokenize`` makes them).
"""

from __future__ import annotations

from unittest import mock

import common
import numpy as np
import torch

TARGET = 3.0  # random-batch epoch seconds / bucketed epoch seconds >= this


def epoch_steps(
    gradient: str, lengths: dict, batch_size: dict, rng: np.random.Generator, order: str
) -> list[dict]:
    from minbert.data import multitask
    from minbert.data.batches import random_batches

    cyclic = gradient == "round-robin"
    if order == "bucketed":
        return multitask.epoch_steps(lengths, batch_size, rng, one_task_per_step=cyclic)

    # epoch_steps draws each pass from multitask.length_bucketed_batches; swapping in
    # random batches keeps the package's own scheduling logic for both variants.
    def shuffled(task_lengths, size, *, shuffle, generator):
        return random_batches(len(task_lengths), size, generator)

    with mock.patch.object(multitask, "length_bucketed_batches", shuffled):
        return multitask.epoch_steps(lengths, batch_size, rng, one_task_per_step=cyclic)


def padding(runner: common.MultitaskRunner, steps: list[dict]) -> dict:
    """Token positions the encoder processes, and how many of them are real."""
    total = real = 0
    for rows_by_task in steps:
        for _, batch in runner.batches(rows_by_task):
            total += batch.ids.numel()
            real += int(batch.mask.sum())
    return {"positions": total, "real_tokens": real, "padding_fraction": 1 - real / total}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", default="baseline", help="a configuration of params.yaml")
    p.add_argument("--scale", default="cpu", help="a scale of params.yaml (sizes)")
    p.add_argument(
        "--steps", type=int, default=None, help="time only the first N steps of each variant's epoch (same N)"
    )
    args = p.parse_args()
    if args.quick:
        args.steps = args.steps or 2
    common.setup(args, repeats=3, warmup=2, quick_repeats=1)

    params, settings = common.multitask_settings(args.config, args.scale)
    orders = ("bucketed", "random")
    device = torch.device(args.device)
    runners = {o: common.MultitaskRunner(settings, params["checkpoint"], device) for o in orders}
    steps = {o: runner.step(settings) for o, runner in runners.items()}
    lengths = runners["bucketed"].lengths
    epoch_length = len(
        epoch_steps(settings.gradient, lengths, settings.batch_size, np.random.default_rng(0), "bucketed")
    )
    n_steps = min(args.steps or epoch_length, epoch_length)

    def draw(order: str, repeat: int) -> list[dict]:
        # Repeat r of both variants draws from the same seed.
        rng = np.random.default_rng([settings.seed, repeat])
        return epoch_steps(settings.gradient, lengths, settings.batch_size, rng, order)[:n_steps]

    for order, step in steps.items():  # warm-up: allocator, optimizer state, kernels
        for rows_by_task in draw(order, args.repeats)[: args.warmup]:
            step(rows_by_task)

    # Each repeat's batch order is drawn beforehand, so only the steps are timed.
    plans = {o: [draw(o, r) for r in range(args.repeats)] for o in orders}

    def epoch(order: str):
        step, pending = steps[order], iter(plans[order])
        return common.synced(lambda: [step(rows_by_task) for rows_by_task in next(pending)], device)

    timings = common.measure({o: epoch(o) for o in orders}, warmup=0, repeats=args.repeats)

    variants = {}
    for order in orders:
        pad = padding(runners[order], plans[order][0])
        t = timings[order]
        variants[order] = {
            **t.as_dict(),
            **pad,
            "padding_of": "the first repeat's batches",
            "steps": n_steps,
            "seconds_per_step": t.median / n_steps,
            "real_tokens_per_s": pad["real_tokens"] / t.median,
        }
    speedup = timings["random"].median / timings["bucketed"].median
    common.table(
        f"multitask epoch: {args.config} at scale {args.scale}, {n_steps} of "
        f"{epoch_length} steps, batch sizes {settings.batch_size}",
        ["batches", "median s", "s/step", "positions", "padding", "real tokens/s"],
        [
            [
                o,
                f"{v['median_s']:.2f}",
                f"{v['seconds_per_step']:.3f}",
                f"{v['positions']:,}",
                f"{v['padding_fraction']:.0%}",
                f"{v['real_tokens_per_s']:,.0f}",
            ]
            for o, v in variants.items()
        ],
    )
    common.console.print(f"bucketing speed-up: {speedup:.2f}x")
    name = "epoch" if n_steps == epoch_length else f"first {n_steps} steps of the epoch"
    results = {
        "config": args.config,
        "scale": args.scale,
        "batch_size": settings.batch_size,
        "train_examples": {t: len(d) for t, d in runners["bucketed"].data.items()},
        "gradient": settings.gradient,
        "smart": settings.smart is not None,
        "epoch_steps": epoch_length,
        "timed_steps": n_steps,
        "full_epoch": n_steps == epoch_length,
        "variants": variants,
        "speedup_bucketed_over_random": speedup,
    }
    targets = [common.target(f"bucketed {name} speed-up over random batches", speedup, ">=", TARGET)]
    common.finish("multitask_epoch", args, results, targets)


if __name__ == "__main__":
    main()
