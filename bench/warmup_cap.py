"""How far the head warm-up's pass cap holds the starts short of converged probes.

Not a timing target. Each distinct start of the cpu scale's configurations (the settings a
start reads, ``RunStart``; the configurations sharing one are named together) is built as
its stage builds it (``minbert.train.start.start``: the heads fitted on the frozen
checkpoint's vectors, from the features stage's code: its output at the tables' seed, written
for each other seed to a temporary directory) once with the committed
``head_warmup.epochs`` and once with ``--cap`` passes, for each seed of ``--seeds``
(default: the tables' seed and the seed study's). Per fit: the pass kept (the lowest
validation loss) and that loss; per start: its validation scores (SST MCC, Quora MCC, STS
Pearson and their mean, the selection score) and the warm-up's seconds. Controls: at the
tables' seed the committed cap must give back each stage's run record (pass kept and
validation loss, ``metrics/multitask/<config>-run.json``) and its epoch-0 validation
selection score (``<config>-history.csv``). Dev is never read. Writes
``bench/results/warmup_cap.json``. About 17 minutes on the project's 2-core CPU.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

import common
import numpy as np


def _starts(params: dict) -> dict[str, list[str]]:
    """The configurations grouped by the start they share (their ``RunStart``)."""
    from minbert.settings import RunStart

    groups: dict[str, list[str]] = {}
    for config in params["configs"]:
        _, settings = common.multitask_settings(config, "cpu")
        key = json.dumps(dataclasses.asdict(RunStart.of(settings)), sort_keys=True, default=str)
        groups.setdefault(key, []).append(config)
    return {configs[0]: configs for configs in groups.values()}


def _features(seed: int, tables_seed: int, workdir: Path):
    """The frozen checkpoint's vectors of ``seed``'s rows: the features stage's output at the
    tables' seed, else its code run for ``seed`` into ``workdir``."""
    if seed == tables_seed:
        return common.probe_features()
    from minbert.pipeline import features as features_stage

    resolved = json.loads((common.REPO / "data" / "settings" / "features.json").read_text(encoding="utf-8"))
    out = workdir / f"features-{seed}"
    features_stage.run({**resolved, "seed": seed}, common.TOKENIZED, out)
    return common.probe_features(out)


def _fit(settings, encoder, tables: dict, features) -> dict:
    """The start of ``settings`` around ``encoder`` (heads fitted; the encoder is only read),
    its warm-up's report and seconds, and its validation scores."""
    from minbert.evaluate.multitask import evaluate_multitask
    from minbert.tasks import MULTITASK_TASKS, SELECTION, TASKS
    from minbert.train.start import start

    began = time.perf_counter()
    model, data, warmup = start(settings, encoder, tables, common.CPU, features=features)
    seconds = time.perf_counter() - began
    vectors = features.covered(data.validation, "train")
    scores, _ = evaluate_multitask(
        model, data.validation, settings.eval_batch_size, common.CPU, vectors=vectors
    )
    return {
        "warmup": warmup,
        "warmup_seconds": round(seconds, 1),
        "validation": {
            **{TASKS[t].selection_key: round(scores[TASKS[t].selection_key], 4) for t in MULTITASK_TASKS},
            "selection": round(scores[SELECTION], 4),
        },
    }


def _controls(config: str, fit: dict) -> list[str]:
    """Where the committed cap's fit at the tables' seed departs from ``config``'s stage."""
    from minbert.results import HISTORY, history_column, run_log
    from minbert.runs.record_parts import WarmupKept
    from minbert.runs.training import MultitaskRunFile, read_run
    from minbert.tasks import SELECTION

    directory = common.REPO / "metrics" / "multitask"
    run = read_run(MultitaskRunFile, directory / f"{config}.json")
    with open(run_log(directory, config, HISTORY), newline="", encoding="utf-8") as f:
        start = next(row for row in csv.DictReader(f) if row["epoch"] == "0")
    here = {task: WarmupKept(**w) for task, w in fit["warmup"].items()}
    problems = [
        f"{config} {task}: {here.get(task)} here, {kept} in its run record"
        for task, kept in run.head_warmup.items()
        if here.get(task) != kept
    ]
    start_selection = float(start[history_column("val", SELECTION)])
    if abs(start_selection - fit["validation"]["selection"]) > 1e-4:
        problems.append(
            f"{config}: start's validation selection {fit['validation']['selection']} here, "
            f"{start_selection} in its history"
        )
    return problems


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--cap", type=int, default=300, help="the longer warm-up's passes at most")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: seed and seed_study.seeds")
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)
    from minbert.device import pin_cpu_kernels

    pin_cpu_kernels()  # the stages' kernels, before the first tensor operation
    from minbert.model.bert import BertModel
    from minbert.model.checkpoint import resolve_checkpoint
    from minbert.pipeline import params as params_module

    params = params_module.load(common.REPO / "params.yaml")
    encoder = BertModel.from_pretrained(resolve_checkpoint(params["checkpoint"]))
    seeds = args.seeds or [params["seed"], *params["seed_study"]["seeds"]]
    tables = {k: t for k, t in common.training_tables().items() if k[1] == "train"}
    workdir = Path(tempfile.mkdtemp(prefix="warmup-cap-"))
    features = {seed: _features(seed, params["seed"], workdir) for seed in seeds}
    starts, problems, rows = [], [], []
    for first, configs in _starts(params).items():
        _, base = common.multitask_settings(first, "cpu")
        committed = base.head_warmup.epochs
        for seed in seeds:
            fits = {}
            for cap in (committed, args.cap):
                warmup = dataclasses.replace(base.head_warmup, epochs=cap)
                settings = dataclasses.replace(base, seed=seed, head_warmup=warmup)
                fits[str(cap)] = _fit(settings, encoder, tables, features[seed])
            if seed == params["seed"]:
                problems += [m for config in configs for m in _controls(config, fits[str(committed)])]
            short, long = fits[str(committed)], fits[str(args.cap)]
            change = round(long["validation"]["selection"] - short["validation"]["selection"], 4)
            starts.append({"configs": configs, "seed": seed, "fits": fits, "selection_change": change})
            rows.append(
                [
                    f"{first} (+{len(configs) - 1})" if len(configs) > 1 else first,
                    seed,
                    *(
                        f"{short['warmup'][t]['epochs_kept']} / {long['warmup'][t]['epochs_kept']}"
                        if t in short["warmup"]
                        else "—"
                        for t in ("sst", "quora", "sts")
                    ),
                    f"{short['validation']['selection']:.4f}",
                    f"{long['validation']['selection']:.4f}",
                    f"{change:+.4f}",
                ]
            )
    changes = [s["selection_change"] for s in starts]
    fits_at_cap = {
        str(cap): sum(
            fit["epochs_kept"] == cap for s in starts for fit in s["fits"][str(cap)]["warmup"].values()
        )
        for cap in (committed, args.cap)
    }
    fit_count = sum(len(s["fits"][str(committed)]["warmup"]) for s in starts)
    common.table(
        f"the starts' heads at {committed} and at {args.cap} passes at most: pass kept, "
        "validation selection score",
        ["start", "seed", "SST", "Quora", "STS", f"at {committed}", f"at {args.cap}", "change"],
        rows,
    )
    common.console.print(
        f"fits keeping their last allowed pass: {fits_at_cap[str(committed)]} of {fit_count} at "
        f"{committed}, {fits_at_cap[str(args.cap)]} of {fit_count} at {args.cap}; selection change: "
        f"mean {np.mean(changes):+.4f}, range {min(changes):+.4f} to {max(changes):+.4f}"
    )
    for message in problems:
        common.console.print(f"[red]control: {message}[/]")
    shutil.rmtree(workdir)
    common.finish(
        "warmup_cap",
        args,
        {
            "scale": "cpu",
            "committed_cap": committed,
            "cap": args.cap,
            "seeds": seeds,
            "fits": fit_count,
            "fits_keeping_last_pass": fits_at_cap,
            "selection_change": {
                "mean": round(float(np.mean(changes)), 4),
                "min": min(changes),
                "max": max(changes),
            },
            "controls": "the committed cap at the tables' seed against each stage's run record and epoch 0",
            "problems": problems,
            "starts": starts,
        },
        [],
    )


if __name__ == "__main__":
    main()
