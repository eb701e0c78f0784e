"""SMART's per-token perturbation norm, chosen on the validation split at the committed settings, over seeds.

Not a timing: the choice of ``smart.token_norm`` for the cpu scale. ``--config`` (default
``best``: PCGrad + SMART + AdamaxW) is trained at the ``cpu`` scale from params.yaml (its
own encoder lr, heads fitted first), without scoring dev (``score_dev=False``: no dev
table is read), once per norm in ``--norms`` and seed in ``--seeds`` (default: the rate
search's, ``lr_search.seeds``, apart from the tables' seed and the seed study's), and
each run's validation history is kept: the selection score (mean of SST MCC, Quora MCC,
STS Pearson) per epoch, epoch 0 being the run's start (heads fitted, encoder untouched).

The rule is the rate search's (``minbert lr-search``): the norm whose mean over the seeds
of the validation selection score at the epoch the stage keeps is highest (a tie keeps the
smaller norm), with its interval over the seeds and its paired differences from the other
norms. The settings the runs ran at are recorded in a run record's form (``ran_at``), the
norm and seed apart, so the report can tell whether the tables' runs share them. Dev is
never read. ``--jobs`` runs side by side, the cores shared. Writes
``bench/results/smart_norm.json``; the report's SMART page and docs/smart.md quote it.
About 70 minutes on the project's 2-core CPU (12 runs, two at a time).
"""

from __future__ import annotations

import dataclasses
import os

import common


def _point(config: str, norm: float, seed: int, threads: int, quick: bool) -> dict:
    """One run: ``config`` at the committed cpu-scale settings with ``norm`` and ``seed``."""
    from minbert.device import pin_cpu_kernels

    pin_cpu_kernels()
    import torch

    from minbert.results import EpochScores
    from minbert.runs.study_files import norm_apart

    torch.set_num_threads(threads)
    params, base = common.smart_settings(config, seed, quick)
    settings = dataclasses.replace(base, smart=dataclasses.replace(base.smart, token_norm=norm))
    tables = {k: t for k, t in common.training_tables().items() if k[1] == "train"}
    result = common.validation_run(settings, params["checkpoint"], tables, common.probe_features())
    history = [row["val_selection"] for row in map(EpochScores.row, result.history)]
    return {
        "token_norm": norm,
        "seed": seed,
        "best_epoch": result.best_epoch,
        "start_selection": history[0],
        "selection": history[result.best_epoch],
        "validation_per_epoch": history,
        "ran_at": norm_apart(common.ran_at(settings, result)),
    }


def choose(points: list[dict]) -> dict:
    """The rate search's rule over the norms, as the report applies it
    (``minbert.report.smart_page.norm_grid``): each norm's mean over the seeds, the chosen
    norm with its interval over the seeds and its paired lead over every other norm."""
    from minbert.metrics import fixed
    from minbert.report.comparisons import seed_interval
    from minbert.report.smart_page import norm_grid
    from minbert.runs.study_files import NormPoint

    typed = [NormPoint.of(p) for p in points]
    chosen, grid = norm_grid(typed)

    def triple(interval):
        return (
            None if interval is None else [fixed(interval.value), fixed(interval.low), fixed(interval.high)]
        )

    def seeds(norm):
        return sorted(p.seed for p in typed if p.token_norm == norm)

    mine = [p.selection for p in typed if p.token_norm == chosen]
    rows = [
        {"token_norm": n, "seeds": seeds(n), "mean": fixed(mean), "chosen_minus": triple(lead)}
        for n, (mean, lead) in grid.items()
    ]
    return {"chosen": chosen, "interval": triple(seed_interval(mine)), "grid": rows}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", default="best")
    p.add_argument("--norms", type=float, nargs="+", default=[0.003, 0.01, 0.03, 0.1])
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: lr_search.seeds")
    p.add_argument("--jobs", type=int, default=2, help="runs side by side, sharing the cores")
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)

    from minbert.pipeline import params as params_module

    params = params_module.load(common.REPO / "params.yaml")
    seeds = args.seeds or params["lr_search"]["seeds"]
    threads = max(1, (args.threads or os.cpu_count() or 1) // args.jobs)
    work = [(args.config, norm, seed, threads, args.quick) for norm in args.norms for seed in seeds]
    points = common.side_by_side(_point, work, args.jobs)
    ran_at = [p.pop("ran_at") for p in points]
    shared, differ = common.shared_ran_at(ran_at)
    for point, r in zip(points, ran_at):
        point.update({k: r[k] for k in sorted(differ)})
    chosen = choose(points)
    common.table(
        f"{args.config}: validation selection score at the kept epoch, per seed",
        ["token_norm", *(f"seed {s}" for s in seeds), "mean", "chosen minus it [95%]"],
        [
            [
                f"{g['token_norm']:g}",
                *(f"{p['selection']:.4f}" for p in points if p["token_norm"] == g["token_norm"]),
                f"{g['mean']:.4f}",
                "(chosen)"
                if g["token_norm"] == chosen["chosen"]
                else "—"
                if g["chosen_minus"] is None
                else "{:+.4f} [{:+.4f}, {:+.4f}]".format(*g["chosen_minus"]),
            ]
            for g in chosen["grid"]
        ],
    )
    common.console.print(f"chosen: token_norm {chosen['chosen']:g}")
    common.finish(
        "smart_norm",
        args,
        {
            "config": args.config,
            "scale": "cpu",
            "rule": "the highest mean over the seeds of the validation selection score at the epoch the "
            "stage keeps (a tie keeps the smaller norm)",
            "threads_per_run": threads,
            "ran_at": shared,
            **chosen,
            "points": points,
        },
        [],
    )


if __name__ == "__main__":
    main()
