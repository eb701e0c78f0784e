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
    python bench/step_ops.py --study gpu        # the whole study at a scale, and its node calls

``--study SCALE`` counts the whole study of params.yaml at SCALE, every stage the
offline runner takes (``minbert bundle --set scale=SCALE``), and writes
``bench/results/<scale>_study_ops.json``: per stage its optimizer steps and scoring
batches (from the scale's sizes and the tokenised data), the operators of each (counted
on the stage's own code: every multitask configuration's ``MultitaskStep`` and
``evaluate_multitask``; a sentiment run's and MLM's training code run for one epoch on
one and on three batches, the difference being two steps; their scoring batches and
the zero-shot stage's counted as the multitask model's SST scoring batches), the
minutes at ``--us-per-op`` (10 us: a step this small is bound by kernel launches on a
GPU), and the study cut into node calls at that assumed rate
(``minbert.offline.calls``, each call at most ``--call-minutes``; ``minbert gpu-plan``
re-cuts them from the smoke call's measured rate). Target: the study's operators within
15 minutes.
"""

from __future__ import annotations

import dataclasses

import common
import numpy as np
import torch

from minbert.offline.calls import DEADLINE_MINUTES, Rate, cut
from minbert.offline.smoke import OperatorCount, counted

# (mode, the mode it wraps or replaces, at most this many times its operators)
TARGETS = [
    ("pcgrad", "summed", 1.5),
    ("round-robin+smart", "round-robin", 2.5),
    ("pcgrad+smart", "pcgrad", 2.5),
]


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", default="best", help="a configuration of params.yaml (its heads)")
    p.add_argument("--scale", default="cpu", help="a scale of params.yaml (sizes)")
    p.add_argument("--pool", type=int, default=6, help="steps counted per mode")
    p.add_argument("--study", metavar="SCALE", help="count the whole study at SCALE instead")
    p.add_argument("--us-per-op", type=float, default=10.0, help="--study: microseconds per operator")
    p.add_argument(
        "--call-minutes", type=float, default=DEADLINE_MINUTES, help="--study: a call's worst minutes"
    )
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=1)
    if args.study:
        study(args)
        return

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


# ----------------------------------------------------------------------------- the whole study


def batches(rows: int, batch_size: int) -> int:
    return -(-rows // batch_size)


def multitask_stage(params: dict, config: str, tables: dict, device: torch.device) -> dict:
    """A multitask stage's operators: its configuration's own step over a pool of the
    steps a run takes, its own scoring batches, times how many of each its run makes."""
    from minbert.data.batches import subsample
    from minbert.data.multitask import TaskData, epoch_steps
    from minbert.evaluate.multitask import evaluate_multitask
    from minbert.pipeline import params as params_module
    from minbert.train.start import run_data

    settings = params_module.multitask_settings(params, config)
    if settings.head_warmup.epochs:
        raise SystemExit(f"{config}: the head warm-up's operators are not counted here")
    runner = common.MultitaskRunner(settings, params["checkpoint"], device)
    run = run_data(settings, runner.model, tables)
    one_task = settings.gradient == "round-robin"
    epoch = epoch_steps(
        runner.lengths, settings.batch_size, np.random.default_rng(0), one_task_per_step=one_task
    )
    step = runner.step(settings)
    step(epoch[0])  # the optimizer's state is created on its first step: not counted
    pool = epoch[1 : 1 + (3 if one_task else 2)]
    per_step = counted(lambda: [step(rows) for rows in pool]) / len(pool)
    step.flush()
    size = settings.eval_batch_size

    def one_batch(task: str, data) -> int:
        """Operators of scoring one batch of ``task`` (the head the run uses)."""
        sample = {task: TaskData(task, subsample(data.table, size, 0), data.siamese)}
        return counted(lambda: evaluate_multitask(runner.model, sample, size, device))

    per_batch = {t: one_batch(t, d) for t, d in run.validation.items()}

    def scoring(tasks: dict) -> int:
        return sum(batches(len(d), size) * per_batch[t] for t, d in tasks.items())

    # Before training and after every epoch: validation and the history's slices; once:
    # SST dev at the start, the full dev sets and the test sets with the chosen epoch.
    per_epoch = scoring(run.validation) + sum(scoring(s) for s in run.slices.values())
    once = scoring({"sst": run.dev["sst"]}) + scoring(run.dev) + scoring(run.test)
    steps = len(epoch) * settings.epochs
    return {
        "steps": steps,
        "ops_per_step": per_step,
        "scoring_ops": per_epoch * (settings.epochs + 1) + once,
        "ops": per_step * steps + per_epoch * (settings.epochs + 1) + once,
        "sst_scoring_batch_ops": per_batch["sst"],
    }


def per_step_by_difference(train_on) -> float:
    """Operators per step of a training run whose ``train_on(n)`` runs one epoch of
    ``n`` batches with every other cost the same: half the difference of 3 and 1."""
    return (counted(lambda: train_on(3)) - counted(lambda: train_on(1))) / 2


def sentiment_stage(params: dict, run: str, tokenized, device, scoring_batch_ops: float) -> dict:
    import dataclasses as dc

    from minbert.data.batches import TokenizedTable, subsample
    from minbert.model.bert import BertModel
    from minbert.model.checkpoint import resolve_checkpoint
    from minbert.pipeline import params as params_module
    from minbert.train.sentiment import train_sentiment

    settings = params_module.sentiment_settings(params, run)
    table = {
        s: TokenizedTable.read(tokenized / f"{settings.task}-{s}.parquet") for s in ("train", "dev", "test")
    }
    directory = resolve_checkpoint(params["checkpoint"])

    def train_on(n: int) -> None:
        small = dc.replace(settings, epochs=1, train_examples=n * settings.batch_size, validation_examples=8)
        train_sentiment(
            small,
            BertModel.from_pretrained(directory),
            table["train"],
            subsample(table["dev"], 8, 0),
            None,
            device,
        )

    per_step = per_step_by_difference(train_on)
    train_rows = len(table["train"]) - settings.validation_examples
    steps = batches(train_rows, settings.batch_size) * settings.epochs
    size = settings.eval_batch_size
    # Validation and dev before training and after every epoch; then dev and test; the
    # last-layer mode encodes every table once more for its features.
    scored = (settings.epochs + 1) * (
        batches(settings.validation_examples, size) + batches(len(table["dev"]), size)
    )
    scored += batches(len(table["dev"]), size) + batches(len(table["test"]), size)
    if settings.mode == "last-layer":
        scored += sum(batches(len(t), size) for t in table.values())
    return {
        "steps": steps,
        "ops_per_step": per_step,
        "scoring_ops": scored * scoring_batch_ops,
        "ops": per_step * steps + scored * scoring_batch_ops,
    }


def mlm_stage(params: dict, start: str, tokenized, device, scoring_batch_ops: float) -> dict:
    import dataclasses as dc

    from minbert.data.corpus import build_corpus
    from minbert.data.masking import Vocabulary
    from minbert.model.checkpoint import resolve_checkpoint
    from minbert.pipeline import params as params_module
    from minbert.train.mlm import _MlmEpochs, build_model, split_corpus

    settings = params_module.mlm_settings(params, start)
    directory = resolve_checkpoint(params["checkpoint"])
    vocab = Vocabulary.read(directory / "vocab.txt")
    corpus = build_corpus(
        tokenized, settings.sources, settings.max_length, cls_id=vocab.cls_id, sep_id=vocab.sep_id
    )
    train, heldout = split_corpus(corpus, settings)

    def train_on(n: int) -> None:
        rows = train.subset(np.arange(n * settings.batch_size))
        loop = _MlmEpochs(
            dc.replace(settings, epochs=1), build_model(settings, directory), rows, [], vocab, device
        )
        loop.epoch(1, lambda _: None, lambda _: None)

    per_step = per_step_by_difference(train_on)
    steps = batches(len(train), settings.batch_size) * settings.epochs
    # The held-out sequences before training, after every epoch and at the end.
    scored = batches(len(heldout), 128) * (settings.epochs + 2)
    return {
        "steps": steps,
        "ops_per_step": per_step,
        "scoring_ops": scored * scoring_batch_ops,
        "ops": per_step * steps + scored * scoring_batch_ops,
    }


def zero_shot_stage(params: dict, tables: dict, scoring_batch_ops: float) -> dict:
    """Each dev pair's two sentences and the Quora training pairs that set the threshold,
    encoded in scoring batches (no training)."""
    size = params["scales"][params["scale"]]["multitask"]["eval_batch_size"]
    pairs = len(tables["sts", "dev"]) + len(tables["quora", "dev"]) + params["zero_shot"]["quora_train_pairs"]
    scored = 2 * (batches(pairs, size) + 2)
    return {
        "steps": 0,
        "ops_per_step": 0,
        "scoring_ops": scored * scoring_batch_ops,
        "ops": scored * scoring_batch_ops,
    }


def study(args) -> None:
    from minbert.pipeline import params as params_module
    from minbert.pipeline.multitask import load_tables

    params = params_module.load(common.REPO / "params.yaml")
    params["scale"] = args.study
    device = torch.device(args.device)
    tables = load_tables(common.TOKENIZED)
    stages = {}
    for config in params["configs"]:
        stages[f"multitask@{config}"] = multitask_stage(params, config, tables, device)
        common.console.log(f"multitask@{config}: {stages[f'multitask@{config}']['ops'] / 1e6:.2f}M operators")
    sst_batch = stages["multitask@baseline"]["sst_scoring_batch_ops"]
    for run in params["sentiment"]["runs"]:
        stages[f"sentiment@{run}"] = sentiment_stage(params, run, common.TOKENIZED, device, sst_batch)
    stages["zero-shot"] = zero_shot_stage(params, tables, sst_batch)
    for start in params["mlm"]["pretrain"]:
        stages[f"mlm@{start}"] = mlm_stage(params, start, common.TOKENIZED, device, sst_batch)
        for config in params["mlm"]["finetune"]:
            stages[f"multitask-mlm@{start}-{config}"] = stages[f"multitask@{config}"]
    for s in stages.values():
        s["minutes"] = s["ops"] * args.us_per_op / 6e7
    total = sum(s["ops"] for s in stages.values())
    minutes = total * args.us_per_op / 6e7
    rate = Rate.assumed(args.us_per_op)
    plan = cut(stages, rate, deadline=args.call_minutes)
    calls = [{"stages": c.stages, "worst_minutes": c.minutes} for period in plan.periods for c in period]
    common.table(
        f"the {args.study} study: aten operators per stage, minutes at {args.us_per_op:g} us per operator",
        ["stage", "steps", "ops per step", "scoring ops", "ops", "minutes"],
        [
            [n, s["steps"], f"{s['ops_per_step']:.0f}", f"{s['scoring_ops'] / 1e6:.2f}M",
             f"{s['ops'] / 1e6:.2f}M", f"{s['minutes']:.2f}"]
            for n, s in stages.items()
        ] + [["the study", "", "", "", f"{total / 1e6:.1f}M", f"{minutes:.1f}"]],
    )  # fmt: skip
    common.table(
        f"node calls of at most {args.call_minutes:g} minutes at the worst estimate",
        ["call", "stages", "worst minutes"],
        [[i + 1, " ".join(c["stages"]), f"{c['worst_minutes']:.1f}"] for i, c in enumerate(calls)],
    )  # fmt: skip
    common.finish(
        f"{args.study}_study_ops",
        args,
        {
            "scale": args.study,
            "us_per_op": args.us_per_op,
            "stage_start_s": rate.stage_start_s,
            "call_start_s": rate.call_start_s,
            "stages": stages,
            "total_ops": total,
            "total_minutes": minutes,
            "calls": calls,
        },
        [
            common.target("the study's operator minutes", minutes, "<=", 15.0),
            common.target(
                "the worst call's minutes", max(c["worst_minutes"] for c in calls), "<=", args.call_minutes
            ),
        ],
    )


if __name__ == "__main__":
    main()
