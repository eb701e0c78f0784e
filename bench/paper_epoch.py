"""One paper-scale multitask epoch on a GPU: seconds per epoch, with a profiler summary.

The paper's setting: a bert-base-sized encoder (12 layers, hidden 768), the
``concatenation`` configuration (cross-encoder heads for Quora and STS; ``--config``
another of params.yaml, written to ``paper_epoch_<config>...``), the paper's
round-robin (one task's batch per step, cycling SST, Quora, STS) with batches of
2 / 36 / 2, bf16 autocast, fused AdamW, and the full training sizes (SST 8,544
sentences, Quora 141,506 pairs, STS 6,040 pairs), so one epoch gives every task
ceil(8,544 / 2) = 4,272 batches: 12,816 steps (a configuration that is not
round-robin, such as ``best``, takes every task's batch in each step: 4,272 steps,
with its own objectives and optimizer). Quora's train split is not on this
machine, so every task's examples are synthetic: random token ids whose lengths are
drawn from the tokenised course data when ``data/tokenized`` exists (for Quora,
from the carved pairs), else a fixed fallback distribution. Weights are random:
speed does not depend on them. ``--random-weights DIR`` takes the shape from a
checkpoint directory's ``config.json`` alone (no weights file needed, so the
benchmark travels without them); ``--checkpoint DIR`` loads real weights.

The epoch runs the pipeline's own training step (``MultitaskStep``), with
``--compile`` for ``torch.compile`` of the encoder layers and ``--cuda-graphs`` for
its replay from one CUDA graph per batch shape (``GraphedStep``: first checked against
the eager step, ``compare_with_eager``; each shape's first two steps, run eagerly and
captured, come before the clock starts). ``--steps N`` times N
steps after a warm-up and scales to the epoch; ``--steps 0`` times every step after
the warm-up.

The target is seconds per epoch (<= 60 s on one H100). Model FLOP utilisation is
reported, not targeted: at bert-base size with batches of 2 sentences a step holds
too little arithmetic for a GPU's peak (an epoch is about 3 PFLOP, so 60 s is about
5% of an H100's dense bf16 peak). MFU = model FLOP of the epoch / seconds / the
device's dense bf16 peak (``--peak-tflops``; H100 and H200 SXM: 989 TFLOP/s); model
FLOP per sequence of length T: (6 N + 12 L T h) x T for training (PaLM, appendix B),
the same count as ``train_step.py``. The profiler summary counts the kernels the
device ran per step (its device-side events), and the operators that take the most
host and device time.

    python bench/paper_epoch.py                 # on a CUDA machine
    python bench/paper_epoch.py --random-weights path/to/bert-base-uncased
    python bench/paper_epoch.py --quick         # a tiny smoke run (CPU too)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from pathlib import Path

import common
import numpy as np
import torch

TARGET_SECONDS = 60.0  # per paper-scale epoch on one H100
SIZES = {"sst": 8544, "quora": 141506, "sts": 6040}
BATCH = {"sst": 2, "quora": 36, "sts": 2}
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4}  # dense bf16, SXM
CHECK_STEPS = 40  # timed steps in the graphs' check against the eager step


def synthetic_tables(sizes: dict, vocab: int, rng: np.random.Generator) -> dict:
    """Random-token tables shaped like the tokenised course data, per task."""
    from minbert.data.batches import Sequences, TokenizedTable

    def lengths_of(task: str, column: str, n: int) -> np.ndarray:
        path = common.TOKENIZED / f"{task}-train.parquet"
        if path.is_file():
            real = TokenizedTable.read(path).sequences[column].lengths()
            return rng.choice(real, size=n)
        return np.clip(rng.lognormal(3.2, 0.5, size=n), 5, 128).astype(int)

    def seqs(lengths):
        return Sequences.from_list(
            [np.concatenate([[101], rng.integers(1000, vocab, n - 2), [102]]) for n in lengths]
        )

    tables = {}
    for task, n in sizes.items():
        ids = [f"{task}{i}" for i in range(n)]
        if task == "sst":
            labels = rng.integers(0, 5, n)
            tables[task] = TokenizedTable(ids, labels, {"input_ids": seqs(lengths_of(task, "input_ids", n))})
            continue
        labels = rng.integers(0, 2, n) if task == "quora" else rng.uniform(0, 5, n)
        lengths = lengths_of(task, "pair_input_ids", n)
        types = Sequences.from_list([np.repeat([0, 1], [m // 2, m - m // 2]) for m in lengths])
        tables[task] = TokenizedTable(
            ids, labels, {"pair_input_ids": seqs(lengths), "pair_token_type_ids": types}
        )
    return tables


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    weights = p.add_mutually_exclusive_group()
    weights.add_argument(
        "--checkpoint",
        default=None,
        help="a bert-base-sized checkpoint directory, weights loaded (default: random bert-base weights)",
    )
    weights.add_argument(
        "--random-weights",
        default=None,
        metavar="DIR",
        help="random weights shaped by DIR/config.json (needs no weights file)",
    )
    p.add_argument("--config", default="concatenation", help="a configuration of params.yaml")
    p.add_argument("--steps", type=int, default=400, help="timed steps (0: the whole epoch)")
    p.add_argument("--compile", action="store_true", help="torch.compile the encoder layers")
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="replay each batch shape's step from a CUDA graph (minbert.train.graphed_step)",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the device's dense bf16 peak (default: from its name)",
    )
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=20, quick_warmup=1)
    if not torch.cuda.is_available() and not args.quick:
        raise SystemExit(
            "paper_epoch.py measures a GPU: no CUDA device here (--quick runs a tiny smoke test on the CPU)"
        )
    if args.cuda_graphs and not torch.cuda.is_available() and not args.quick:
        raise SystemExit("--cuda-graphs needs a CUDA device (--quick runs the path on the CPU, no graphs)")

    from minbert.data.multitask import TaskData, epoch_steps
    from minbert.model.bert import BertConfig, BertModel
    from minbert.tasks import MULTITASK_TASKS
    from minbert.train.multitask_step import MultitaskStep
    from minbert.train.start import build_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _, settings = common.multitask_settings(args.config, "paper")
    settings = dataclasses.replace(settings, batch_size=BATCH)
    sizes = {t: 64 for t in MULTITASK_TASKS} if args.quick else SIZES
    if args.quick:
        args.steps = 3
    config = (
        BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        if args.quick
        else BertConfig()
    )
    torch.manual_seed(args.seed)
    if args.random_weights:
        config = BertConfig.from_json(Path(args.random_weights) / "config.json")
    encoder = BertModel.from_pretrained(args.checkpoint) if args.checkpoint else BertModel(config)
    config = encoder.config
    model = build_model(dataclasses.replace(settings, compile=args.compile), encoder, device).train()
    rng = np.random.default_rng(args.seed)
    data = {
        t: TaskData(t, table, model.is_siamese(t))
        for t, table in synthetic_tables(sizes, config.vocab_size, rng).items()
    }
    # Capturable: an optimizer step a graph can record (AdamaxW's rate and step counts on the device).
    step = MultitaskStep(settings, model, data, device, capturable=args.cuda_graphs)
    plan = epoch_steps(
        {t: d.lengths for t, d in data.items()},
        BATCH,
        rng,
        one_task_per_step=settings.gradient == "round-robin",
    )
    epoch_steps = len(plan)
    # Every step after the warm-up, at most: the warm-up steps are never timed.
    timed = epoch_steps - args.warmup if args.steps == 0 else min(args.steps, epoch_steps - args.warmup)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    warmup = plan[: args.warmup]
    timed_plan = plan[args.warmup : args.warmup + timed]
    run, graphed, check, capture_steps = step, None, None, []
    if args.cuda_graphs:
        from minbert.train.graphed_step import GraphedStep, compare_with_eager, shape_key

        if device.type == "cuda":
            run = graphed = GraphedStep(step)
        else:  # --quick: a stand-in "graph" reruns the step: the path, not its speed
            run = graphed = GraphedStep(step, new_capture=lambda: lambda fn, generators: fn)
    for rows in warmup:
        run(rows)
    if graphed:
        # Before any timing: graphs train as the eager step does (dropout off), on the
        # warm-up's steps and the first timed ones; the check drops its graphs after.
        check = compare_with_eager(graphed, warmup + timed_plan[:CHECK_STEPS])
        # A shape's first step runs eagerly and its second is captured: those steps of
        # the timed shapes run before the clock starts, so it times replays alone.
        seen = Counter()
        for rows in timed_plan:
            key = shape_key(step.load(rows))
            if seen[key] < 2:
                capture_steps.append(rows)
                seen[key] += 1
        for rows in capture_steps:
            run(rows)
    sync()
    eager_before = graphed.eager_steps if graphed else 0
    start = time.perf_counter()
    for rows in timed_plan:
        run(rows)
    sync()
    seconds = time.perf_counter() - start

    def flop(rows_by_task) -> float:
        total = 0.0
        for task, rows in rows_by_task.items():
            for t in data[task].lengths[rows].tolist():
                total += (
                    6 * config.num_parameters_non_embedding
                    + 12 * config.num_hidden_layers * t * config.hidden_size
                ) * t
        return total

    timed_flop = sum(flop(r) for r in timed_plan)
    eager_timed = graphed.eager_steps - eager_before if graphed else None
    profile = profile_steps(run, plan[args.warmup : args.warmup + PROFILED_STEPS], device)
    epoch_seconds = seconds / timed * epoch_steps
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), math.nan)
    mfu = timed_flop / seconds / (peak * 1e12)
    common.table(
        f"paper-scale epoch: {args.config}, batch {BATCH}, {epoch_steps} steps, on {name}",
        ["timed steps", "s/step", "epoch s", "TFLOP/s", "MFU"],
        [
            [
                timed,
                f"{seconds / timed * 1e3:.1f} ms",
                f"{epoch_seconds:.1f}",
                f"{timed_flop / seconds / 1e12:.1f}",
                f"{mfu:.1%}",
            ]
        ],
    )
    results = {
        "device": name,
        "configuration": args.config,
        "config": dataclasses.asdict(config),
        "batch_size": BATCH,
        "sizes": sizes,
        "epoch_steps": epoch_steps,
        "timed_steps": timed,
        "timed_seconds": seconds,
        "epoch_seconds": epoch_seconds,
        "timed_model_flop": timed_flop,
        "peak_tflops": peak,
        "mfu": mfu,
        "weights": (
            f"loaded from {args.checkpoint}"
            if args.checkpoint
            else f"random, shaped by {args.random_weights}/config.json"
            if args.random_weights
            else "random (BertConfig defaults: bert-base)"
        ),
        "compile": args.compile,
        # Graphs: how many shapes the timed steps held, the steps run before the clock to
        # capture them, and eager steps inside the timed ones (0: replays alone).
        "cuda_graphs": (
            {
                "graphs": len(graphed.graphs),
                "capture_steps": len(capture_steps),
                "eager_timed_steps": eager_timed,
                "check_against_eager": {**dataclasses.asdict(check), "passed": check.passed},
            }
            if graphed
            else None
        ),
        "bf16_autocast": device.type == "cuda",
        # Where the last steps' time went: the host's view and the device's.
        "profile": profile,
    }
    # One file per variant, so that one call can measure several side by side.
    common.finish(
        "paper_epoch"
        + ("" if args.config == "concatenation" else f"_{args.config}")
        + "_compile" * args.compile
        + "_graphs" * args.cuda_graphs,
        args,
        results,
        [common.target("paper-scale epoch seconds", epoch_seconds, "<=", TARGET_SECONDS)]
        + (
            [
                common.target(
                    "graphed step's loss, relative difference from eager",
                    check.loss_difference,
                    "<=",
                    check.loss_tolerance,
                )
            ]
            if check
            else []
        ),
    )


PROFILED_STEPS = 6


def profile_steps(step, plan: list[dict], device) -> dict:
    """torch.profiler over a few steps: the operators that take the most host time and
    the most device time, and how many kernels a step launches."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for rows in plan:
            step(rows)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return profile_summary(prof.key_averages(), max(1, len(plan)), device.type == "cuda")


def device_events(events) -> list:
    """The events the device ran (kernels, copies, memsets), as torch's own table totals
    them: an operator's self device time repeats its kernels' and a user annotation
    (``Optimizer.step``) spans them, so adding those too counts a kernel two or three times."""
    from torch.autograd import DeviceType

    return [
        e for e in events if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)
    ]


def profile_summary(events, steps: int, on_device: bool) -> dict:
    """Per step: host and device milliseconds, kernels and aten operators, and the costliest
    operators and kernels, from a profiler's ``key_averages()`` over ``steps`` steps."""
    from torch.autograd import DeviceType

    def top(ranked_events, key: str, n: int = 12) -> list[dict]:
        ranked = sorted(ranked_events, key=lambda e: getattr(e, key), reverse=True)[:n]
        return [
            {"name": e.key, "calls_per_step": e.count / steps, "ms_per_step": getattr(e, key) / 1e3 / steps}
            for e in ranked
        ]

    device = device_events(events) if on_device else []
    return {
        "steps": steps,
        "host_ms_per_step": sum(e.self_cpu_time_total for e in events) / 1e3 / steps,
        "device_ms_per_step": (
            sum(e.self_device_time_total for e in device) / 1e3 / steps if on_device else None
        ),
        # Kernels the device ran (its own events), whatever API launched them: graph
        # replays and library kernels included, unlike counting cudaLaunchKernel calls.
        "device_kernels_per_step": sum(e.count for e in device) / steps if on_device else None,
        # Operators the host dispatched (the CPU-measurable proxy for launch overhead).
        "aten_ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")) / steps,
        "top_host": top(events, "self_cpu_time_total"),
        # The costliest kernels, and the operators that launched the most device time.
        "top_device": top(device, "self_device_time_total") if on_device else [],
        "top_device_ops": (
            top([e for e in events if e.device_type == DeviceType.CPU], "self_device_time_total")
            if on_device
            else []
        ),
    }


if __name__ == "__main__":
    main()
