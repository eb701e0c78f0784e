"""SMART's per-token perturbation norm, chosen on the validation split at the committed settings.

Not a timing: the choice of ``smart.token_norm`` for the cpu scale. ``--config`` (default
``best``: PCGrad + SMART + AdamaxW) is trained at the ``cpu`` scale from params.yaml (its
own encoder lr, heads fitted first), without scoring dev (``score_dev=False``: no dev
table is read), once per norm in ``--norms``, and each run's validation
history is kept: the selection score (mean of SST MCC, Quora MCC, STS Pearson) and the
SST loss per epoch, epoch 0 being the run's start (heads fitted, encoder untouched).

The chosen norm is the one whose best epoch (1 or later, as the stage chooses it) scores
highest on the validation selection score; the table also says whether that epoch beats
the start. Dev is never read. Writes ``bench/results/smart_norm.json``; params.yaml
and docs/smart.md quote it. About 15 minutes on the project's 2-core CPU.
"""

from __future__ import annotations

import dataclasses

import common


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", default="best")
    p.add_argument("--norms", type=float, nargs="+", default=[0.1, 0.03, 0.01])
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)

    from minbert.device import pin_cpu_kernels
    from minbert.results import EpochScores

    pin_cpu_kernels()
    params, base = common.multitask_settings(args.config, "cpu")
    if not base.smart:
        raise SystemExit(f"{args.config}: SMART is off in this configuration")
    base = dataclasses.replace(base, test_predictions=False)
    if args.quick:
        base = dataclasses.replace(base, epochs=1)
    tables = {k: t for k, t in common.training_tables().items() if k[1] == "train"}
    features = common.probe_features()

    keys = ("val_selection", "val_sst_mcc", "val_quora_mcc", "val_sts_pearson", "val_loss_sst")
    results = {}
    for norm in args.norms:
        common.console.print(f"[bold]token_norm {norm:g}[/]")
        settings = dataclasses.replace(base, smart=dataclasses.replace(base.smart, token_norm=norm))
        result = common.validation_run(settings, params["checkpoint"], tables, features)
        history = [{k: row[k] for k in ("epoch", *keys)} for row in map(EpochScores.row, result.history)]
        start, best = history[0]["val_selection"], history[result.best_epoch]["val_selection"]
        results[f"{norm:g}"] = {
            "token_norm": norm,
            "best_epoch": result.best_epoch,
            "start_selection": start,
            "best_selection": best,
            "above_start": best > start,
            "history": history,
        }
    chosen = max(results.values(), key=lambda r: r["best_selection"])["token_norm"]
    epochs = [row["epoch"] for row in next(iter(results.values()))["history"]]
    common.table(
        f"{args.config}: validation selection score by epoch (epoch 0: the start)",
        ["token_norm", *(f"epoch {e}" for e in epochs), "best above start"],
        [
            [name, *(f"{row['val_selection']:.4f}" for row in r["history"]), str(r["above_start"])]
            for name, r in results.items()
        ],
    )
    common.console.print(f"chosen: token_norm {chosen:g}")
    common.finish(
        "smart_norm",
        args,
        {
            "config": args.config,
            "lr": base.lr,
            "rule": "the highest validation selection score at the epoch the stage would choose",
            "chosen": chosen,
            "norms": results,
        },
        [],
    )


if __name__ == "__main__":
    main()
