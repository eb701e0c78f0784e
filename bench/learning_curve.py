"""Rows per task against epochs at equal work: what the cpu scale should spend its time on.

Not a timing target: the choice of the cpu scale's ``train_examples`` and ``epochs``.
Each ``--config`` (default ``baseline`` and ``best``) is trained at the cpu scale's
settings from params.yaml with only the rows and epochs changed, at each budget of
``--budgets`` examples seen per task (rows x epochs: 1,024, the fewest rows the cpu scale
may train on, and twice that), split as ``--epochs`` (1, 2 and 3 epochs: the same
optimizer steps and examples, spent on more rows or on more passes).
The heads are fitted first on the rows the run trains on, as the stage fits them; dev is
never scored (``score_dev=False``): each run's validation selection score (the mean of
SST MCC, Quora MCC and STS Pearson on the validation split) at the epoch the stage would
keep, epoch 0 (the start: fitted heads, untouched encoder) included, and the seconds of
its training (PCGrad + SMART about three times round-robin's). Writes
``bench/results/<--name>.json`` (learning_curve_baseline.json, learning_curve_best.json:
one process each, ``--threads 1`` side by side on two cores); params.yaml and
docs/method.md quote them.
"""

from __future__ import annotations

import dataclasses
import time

import common


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["baseline", "best"])
    p.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument(
        "--name",
        default="learning_curve",
        help="the results file's name (one per configuration when they run side by side)",
    )
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)

    from minbert.device import pin_cpu_kernels
    from minbert.results import EpochScores

    pin_cpu_kernels()
    tables = {k: t for k, t in common.training_tables().items() if k[1] == "train"}
    features = common.probe_features()
    budgets = args.budgets[:1] if args.quick else args.budgets
    keys = ("val_selection", "val_sst_mcc", "val_quora_mcc", "val_sts_pearson")
    runs = []
    for config in args.configs:
        params, base = common.multitask_settings(config, "cpu")
        base = dataclasses.replace(base, test_predictions=False)
        for budget in budgets:
            for epochs in args.epochs:
                rows = budget // epochs
                settings = dataclasses.replace(
                    base, epochs=epochs, train_examples=dict.fromkeys(base.train_examples, rows)
                )
                common.console.print(f"[bold]{config}: {rows} rows x {epochs} epochs[/]")
                began = time.perf_counter()
                result = common.validation_run(settings, params["checkpoint"], tables, features)
                history = [
                    {k: row[k] for k in ("epoch", *keys)} for row in map(EpochScores.row, result.history)
                ]
                runs.append(
                    {
                        "config": config,
                        "budget": budget,
                        "rows": rows,
                        "epochs": epochs,
                        "optimizer_steps": result.optimizer_steps,
                        "seconds": round(time.perf_counter() - began, 1),
                        "chosen_epoch": result.best_epoch,
                        "start_selection": history[0]["val_selection"],
                        "chosen_selection": history[result.best_epoch]["val_selection"],
                        "history": history,
                    }
                )
    common.table(
        "validation selection score at the epoch the stage keeps (epoch 0: the start)",
        ["config", "budget", "rows x epochs", "steps", "seconds", "start", "kept", "epoch kept"],
        [
            [r["config"], r["budget"], f"{r['rows']} x {r['epochs']}", r["optimizer_steps"],
             f"{r['seconds']:.0f}", f"{r['start_selection']:.4f}", f"{r['chosen_selection']:.4f}",
             r["chosen_epoch"]]
            for r in runs
        ],
    )  # fmt: skip
    common.finish(
        args.name,
        args,
        {
            "configs": args.configs,
            "rule": "per budget, the split with the highest validation selection score at the epoch "
            "the stage keeps; dev is never scored",
            "runs": runs,
        },
        [],
    )


if __name__ == "__main__":
    main()
