"""Why SMART's heads collapse with the authors' perturbation: variants of the committed settings, over seeds.

Not a timing: a measurement of the training the ``multitask`` stage runs. ``--config``
(default ``best``: PCGrad + SMART + AdamaxW) is trained at the ``cpu`` scale from
params.yaml, without scoring dev (``score_dev=False``: no dev table is read), once per
variant and seed in ``--seeds`` (default: the rate search's, ``lr_search.seeds``, apart
from the tables' seed and the seed study's). Every epoch records:

* the validation split's scores (accuracy / Pearson, the chance-corrected MCC and the
  selection score);
* per task, the mean over the epoch's steps of each term's gradient norm on that task's
  head: the task loss, lambda_s * R_s (the smoothness term) and mu * D_breg (the Bregman
  term), and the Bregman term itself;
* the distance between the student's and the momentum teacher's parameters, and how far
  the student has moved from where fine-tuning started, for each head and the encoder.

Variants, each a change to the runs' own settings (the first is none: the control): the
perturbation of the authors' code (``token_norm`` 1); that with the teacher's momentum at
a horizon of a tenth of the run's steps instead of 0.99; the runs' settings without the
head warm-up. The settings the runs depart from are recorded in a run record's form
(``ran_at``), so the report can tell whether they are the tables' run's. ``--jobs`` runs
side by side, the cores shared. Writes ``bench/results/smart_collapse.json``; the report's
SMART page and docs/smart.md quote it. About 90 minutes on the project's 2-core CPU
(12 runs, two at a time).
"""

from __future__ import annotations

import dataclasses
import os

import common
import numpy as np
import torch

from minbert.tasks import MULTITASK_TASKS, SELECTION
from minbert.tasks import TASKS as SPECS
from minbert.train.multitask_step import MultitaskObserver

PARTS = ("loss", "adversarial", "bregman")


class Watch(MultitaskObserver):
    """Each SMART step's gradient norms of each term on its task's head (the terms still
    hold their graphs: the step's backward has not run), and every epoch's scores and
    distances."""

    def __init__(self, smart) -> None:
        self.smart = smart
        self.grads: dict[str, list[list[float]]] = {t: [] for t in MULTITASK_TASKS}
        self.start: dict = {}
        self.log: list[dict] = []

    def objective(self, task, terms, model) -> None:
        weighted = {
            "loss": terms.loss,
            "adversarial": self.smart.lambda_s * terms.adversarial,
            "bregman": self.smart.mu * terms.bregman,
        }
        head = list(model.heads[task].parameters())
        norms = []
        for part in PARTS:
            found = torch.autograd.grad(weighted[part], head, retain_graph=True, allow_unused=True)
            norms.append(float(torch.sqrt(sum((g.float() ** 2).sum() for g in found if g is not None))))
        self.grads[task].append([*norms, float(terms.bregman.detach())])

    def epoch(self, scores, model, teacher) -> None:
        validation = {
            k: scores.validation[k]
            for t in MULTITASK_TASKS
            for k in (SPECS[t].metric_key, SPECS[t].selection_key)
        }
        validation["selection"] = scores.validation[SELECTION]
        if scores.epoch == 0:
            self.start.update({n: p.detach().clone() for n, p in model.named_parameters()})
            self.log.append({"epoch": 0, "validation": validation})
            return
        entry = {"epoch": scores.epoch, "validation": validation, **self.distances(model, teacher)}
        for t in MULTITASK_TASKS:
            mean = np.mean(self.grads[t], axis=0) if self.grads[t] else np.zeros(len(PARTS) + 1)
            # Five significant digits: a small perturbation's term is far below the loss's.
            rounded = [float(f"{m:.5g}") for m in mean.tolist()]
            entry[f"head_gradient_{t}"] = dict(zip((*PARTS, "bregman_value"), rounded))
            self.grads[t].clear()
        self.log.append(entry)

    def distances(self, model, teacher) -> dict:
        theirs, own = dict(teacher.module.named_parameters()), dict(model.named_parameters())
        out = {}
        for part in (*(f"heads.{t}" for t in MULTITASK_TASKS), "encoder"):
            names = [n for n in own if n.startswith(part)]
            out[part] = {
                "teacher_distance": float(sum(((own[n] - theirs[n]) ** 2).sum() for n in names) ** 0.5),
                "moved": float(sum(((own[n] - self.start[n]) ** 2).sum() for n in names) ** 0.5),
            }
        return out


def _point(config: str, change: dict, seed: int, threads: int, quick: bool) -> dict:
    """One run: ``config`` at the committed cpu-scale settings with ``change`` and ``seed``."""
    from minbert.device import pin_cpu_kernels

    pin_cpu_kernels()
    torch.set_num_threads(threads)
    params, base = common.smart_settings(config, seed, quick)
    change = dict(change)
    warm = change.pop("warmup", True)
    settings = dataclasses.replace(base, smart=dataclasses.replace(base.smart, **change))
    if not warm:
        settings = dataclasses.replace(
            settings, head_warmup=dataclasses.replace(settings.head_warmup, epochs=0)
        )
    watch = Watch(settings.smart)
    tables = {k: t for k, t in common.training_tables().items() if k[1] == "train"}
    result = common.validation_run(settings, params["checkpoint"], tables, common.probe_features(), watch)
    return {
        "seed": seed,
        "best_epoch": result.best_epoch,
        "epochs": watch.log,
        # The settings the variant departs from: the runs' own, at this seed's realised sizes.
        "ran_at": common.ran_at(base, result),
    }


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", default="best")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: lr_search.seeds")
    p.add_argument("--jobs", type=int, default=2, help="runs side by side, sharing the cores")
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)

    params, base = common.smart_settings(args.config, args.seed, args.quick)
    seeds = args.seeds or params["lr_search"]["seeds"]
    per_task = max(-(-base.train_examples[t] // base.batch_size[t]) for t in MULTITASK_TASKS)
    steps = base.epochs * per_task * (len(MULTITASK_TASKS) if base.gradient == "round-robin" else 1)
    horizon_beta = 1.0 - 1.0 / (0.1 * steps)
    variants = {
        "the runs' settings": {},
        "token_norm 1 (the authors' code)": {"token_norm": 1.0},
        f"token_norm 1, teacher horizon 10% of {steps} steps (beta {horizon_beta:.3f})": {
            "token_norm": 1.0,
            "beta": horizon_beta,
        },
        "the runs' settings, no head warm-up": {"warmup": False},
    }
    threads = max(1, (args.threads or os.cpu_count() or 1) // args.jobs)
    work = [
        (args.config, change, seed, threads, args.quick) for change in variants.values() for seed in seeds
    ]
    runs = common.side_by_side(_point, work, args.jobs)
    ran_at = [r.pop("ran_at") for r in runs]
    shared, differ = common.shared_ran_at(ran_at)
    for run, r in zip(runs, ran_at):
        run.update({k: r[k] for k in sorted(differ)})
    results = {}
    for k, (name, change) in enumerate(variants.items()):
        smart = {**dataclasses.asdict(base.smart), **{c: v for c, v in change.items() if c != "warmup"}}
        results[name] = {
            "change": change,
            "smart": smart,
            "runs": runs[k * len(seeds) : (k + 1) * len(seeds)],
        }
    common.table(
        f"{args.config}: validation Quora MCC by epoch, per seed; epoch 1's gradient norms on the Quora head",
        ["variant", "seed", "epochs", *(f"|grad| {p}" for p in PARTS)],
        [
            [
                name,
                run["seed"],
                " ".join(f"{e['validation']['quora_mcc']:.3f}" for e in run["epochs"]),
                *(f"{run['epochs'][1]['head_gradient_quora'][p]:.2f}" for p in PARTS),
            ]
            for name, r in results.items()
            for run in r["runs"]
        ],
    )
    common.finish(
        "smart_collapse",
        args,
        {
            "config": args.config,
            "scale": "cpu",
            "lr": base.lr,
            "steps": steps,
            "seeds": seeds,
            "threads_per_run": threads,
            "ran_at": shared,
            "variants": results,
        },
        [],
    )


if __name__ == "__main__":
    main()
