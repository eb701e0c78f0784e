"""SST rows at the same number of batches: whether fine-tuning beats its SST start when SST
gets more rows, and what the rows cost.

Not a timing target: evidence for the cpu scale's SST rows. At 1,152 SST rows per task an
earlier study's SST moved by +0.006 to +0.044 accuracy from its start (epoch 0: the head
fitted on the frozen encoder), inside the paired interval in 7 of 11 configurations; the
scale now takes 2,304 in batches of 16. Each ``--configs`` entry (default ``baseline`` and
``best``) is trained at the cpu scale from params.yaml as the scale has it, and again with
each ``--sst`` ``ROWSxBATCH`` (default ``1152x8``: half the scale's rows in the same number
of batches, so every other task and the optimizer steps are unchanged), the head warm-up
fitting on the rows each run trains on.
SST's validation split is widened to ``--sst-validation`` rows (default 1,000, set aside from
the training rows as the stage does; at 200, an MCC difference of about 0.1 is noise) in
every run alike; dev is never scored. Per run: SST MCC and accuracy on validation at epoch
0 and at the epoch the stage keeps, the selection score, the optimizer steps and the
seconds of the run (one seed: the pipeline's). Writes ``bench/results/<--name>.json``.
"""

from __future__ import annotations

import dataclasses
import time

import common

SST_KEYS = ("sst_mcc", "sst_accuracy")


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["baseline", "best"])
    p.add_argument("--sst", nargs="+", default=["1152x8"], help="SST rows x batch, besides the scale's")
    p.add_argument("--sst-validation", type=int, default=1000)
    p.add_argument("--name", default="sst_rows")
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)

    from minbert.device import pin_cpu_kernels
    from minbert.tasks import SELECTION

    pin_cpu_kernels()
    tables = {k: t for k, t in common.training_tables().items() if k[1] == "train"}
    features = common.probe_features()
    runs = []
    for config in args.configs:
        params, base = common.multitask_settings(config, "cpu")
        base = dataclasses.replace(
            base,
            test_predictions=False,
            validation_examples={**base.validation_examples, "sst": args.sst_validation},
        )
        arms = [(base.train_examples["sst"], base.batch_size["sst"])]
        arms += [tuple(int(n) for n in arm.split("x")) for arm in args.sst]
        for rows, batch in arms[:1] if args.quick else arms:
            settings = dataclasses.replace(
                base,
                train_examples={**base.train_examples, "sst": rows},
                batch_size={**base.batch_size, "sst": batch},
            )
            common.console.print(f"[bold]{config}: SST {rows} rows, batch {batch}[/]")
            began = time.perf_counter()
            result = common.validation_run(settings, params["checkpoint"], tables, features)
            start, kept = result.history[0].validation, result.history[result.best_epoch].validation
            runs.append(
                {
                    "config": config,
                    "sst_rows": rows,
                    "sst_batch": batch,
                    "optimizer_steps": result.optimizer_steps,
                    "seconds": round(time.perf_counter() - began, 1),
                    "chosen_epoch": result.best_epoch,
                    "start": {k: start[k] for k in (*SST_KEYS, SELECTION)},
                    "kept": {k: kept[k] for k in (*SST_KEYS, SELECTION)},
                }
            )
    common.table(
        f"validation (SST {args.sst_validation} rows): start (epoch 0) -> the epoch the stage keeps",
        ["config", "SST rows x batch", "steps", "seconds", "SST MCC", "SST acc", "selection", "epoch"],
        [
            [r["config"], f"{r['sst_rows']} x {r['sst_batch']}", r["optimizer_steps"], f"{r['seconds']:.0f}",
             *(f"{r['start'][k]:.3f} -> {r['kept'][k]:.3f}" for k in (*SST_KEYS, SELECTION)),
             r["chosen_epoch"]]
            for r in runs
        ],
    )  # fmt: skip
    rule = "validation only (dev is never scored); one seed"
    results = {"configs": args.configs, "sst_validation": args.sst_validation, "rule": rule, "runs": runs}
    common.finish(args.name, args, results, [])


if __name__ == "__main__":
    main()
