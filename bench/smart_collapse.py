"""Why SMART's heads collapsed to one answer at the cpu scale, and what stops it.

Not a timing: a measurement of the training the ``multitask`` stage runs. ``--config``
(default ``best``: PCGrad + SMART + AdamaxW) is trained at the ``cpu`` scale from
params.yaml, without scoring dev (``train_multitask(score_dev=False)``: no dev table
is read), once per variant of SMART's settings, and every epoch records:

* the validation split's scores (accuracy / Pearson and the chance-corrected MCC);
* per task, the mean over the epoch's steps of each term's gradient norm on that task's
  head: the task loss, lambda_s * R_s (the smoothness term) and mu * D_breg (the Bregman
  term), and the Bregman term itself;
* the distance between the student's and the momentum teacher's parameters, and how far
  the student has moved from where fine-tuning started, for each head and the encoder.

Variants: the perturbation of the authors' code (``token_norm`` 1) and smaller ones; the
teacher's momentum with a horizon of a tenth of the run's steps instead of 0.99; with
and without the head warm-up. Writes ``bench/results/smart_collapse.json``; the report
and docs/smart.md quote it. About 15 minutes on the project's 2-core CPU.
"""

from __future__ import annotations

import dataclasses

import common
import numpy as np
import torch

TASKS = ("sst", "quora", "sts")
PARTS = ("loss", "adversarial", "bregman")


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", default="best")
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)

    from minbert.device import pin_cpu_kernels
    from minbert.tasks import TASKS as SPECS
    from minbert.train.multitask_step import MultitaskObserver

    pin_cpu_kernels()
    params, base = common.multitask_settings(args.config, "cpu")
    base = dataclasses.replace(base, test_predictions=False)
    if args.quick:
        base = dataclasses.replace(base, epochs=1)
    tables = {k: t for k, t in common.training_tables().items() if k[1] == "train"}
    features = common.probe_features()
    per_task = max(-(-base.train_examples[t] // base.batch_size[t]) for t in TASKS)
    steps = base.epochs * per_task * (len(TASKS) if base.gradient == "round-robin" else 1)

    class Watch(MultitaskObserver):
        """Each SMART step's gradient norms of each term on its task's head (the terms still
        hold their graphs: the step's backward has not run), and every epoch's scores and
        distances."""

        def __init__(self, smart) -> None:
            self.smart = smart
            self.grads: dict[str, list[list[float]]] = {t: [] for t in TASKS}
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
            self.grads[task].append([*norms, float(terms.bregman)])

        def epoch(self, scores, model, teacher) -> None:
            validation = {
                k: scores.validation[k] for t in TASKS for k in (SPECS[t].metric_key, SPECS[t].selection_key)
            }
            if scores.epoch == 0:
                self.start.update({n: p.detach().clone() for n, p in model.named_parameters()})
                self.log.append({"epoch": 0, "validation": validation})
                return
            entry = {"epoch": scores.epoch, "validation": validation, **self.distances(model, teacher)}
            for t in TASKS:
                mean = np.mean(self.grads[t], axis=0) if self.grads[t] else np.zeros(len(PARTS) + 1)
                entry[f"head_gradient_{t}"] = dict(zip((*PARTS, "bregman_value"), np.round(mean, 5).tolist()))
                self.grads[t].clear()
            self.log.append(entry)

        def distances(self, model, teacher) -> dict:
            theirs, own = dict(teacher.module.named_parameters()), dict(model.named_parameters())
            out = {}
            for part in (*(f"heads.{t}" for t in TASKS), "encoder"):
                names = [n for n in own if n.startswith(part)]
                out[part] = {
                    "teacher_distance": float(sum(((own[n] - theirs[n]) ** 2).sum() for n in names) ** 0.5),
                    "moved": float(sum(((own[n] - self.start[n]) ** 2).sum() for n in names) ** 0.5),
                }
            return out

    horizon_beta = 1.0 - 1.0 / (0.1 * steps)
    variants = {
        "token_norm 1 (the authors' code)": {"token_norm": 1.0},
        "token_norm 0.1": {"token_norm": 0.1},
        f"token_norm 1, teacher horizon 10% of {steps} steps (beta {horizon_beta:.3f})": {
            "token_norm": 1.0,
            "beta": horizon_beta,
        },
        "token_norm 0.1, no head warm-up": {"token_norm": 0.1, "warmup": False},
    }
    results = {}
    for name, change in variants.items():
        common.console.print(f"[bold]{name}[/]")
        change = dict(change)
        warm = change.pop("warmup", True)
        settings = dataclasses.replace(base, smart=dataclasses.replace(base.smart, **change))
        if not warm:
            settings = dataclasses.replace(
                settings, head_warmup=dataclasses.replace(settings.head_warmup, epochs=0)
            )
        watch = Watch(settings.smart)
        result = common.validation_run(settings, params["checkpoint"], tables, features, watch)
        results[name] = {
            "smart": dataclasses.asdict(settings.smart),
            "best_epoch": result.best_epoch,
            "epochs": watch.log,
        }
    rows = []
    for name, r in results.items():
        first = r["epochs"][1]
        rows.append(
            [
                name,
                *(f"{r['epochs'][e]['validation']['quora_mcc']:.3f}" for e in range(len(r["epochs"]))),
                *(f"{first['head_gradient_quora'][p]:.2f}" for p in PARTS),
            ]
        )
    epochs = len(next(iter(results.values()))["epochs"])
    common.table(
        f"{args.config}: validation Quora MCC by epoch; epoch 1's gradient norms on the Quora head",
        ["variant", *(f"epoch {e}" for e in range(epochs)), *(f"|grad| {p}" for p in PARTS)],
        rows,
    )
    common.finish(
        "smart_collapse",
        args,
        {"config": args.config, "lr": base.lr, "steps": steps, "variants": results},
        [],
    )


if __name__ == "__main__":
    main()
