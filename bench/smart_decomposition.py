"""What SMART's smoothness term R_s is made of: perturbation, dropout, bf16 rounding.

Not a timing: a measurement of ``minbert.train.smart`` on the real encoder. The
committed checkpoint (``checkpoint`` of params.yaml, all-MiniLM-L6-v2) with the
cross-encoder pair heads of ``best`` (``MultitaskBert``; heads freshly drawn from
``--seed``, pooling, head dropout and STS output of the ``cpu`` scale), in training
mode, on ``--batches`` batches of ``--batch-size`` training examples of each of SST,
Quora and STS (the first rows of the course files, tokenised here with the
checkpoint's vocabulary: the pipeline's tokenised tables are not needed).

For every batch and task, each variant starts from the same global random state and
the same random start of the ascent, and records R_s (the divergence at the
perturbation the ascent finds) and its control (the same divergence with no
perturbation, same mask policy). Variants:

* ``default``: ``SmartSettings()`` (token projection, shared masks). With shared
  masks R_s is the perturbation's alone (its control is 0);
* ``ball_shared``: the paper's perturbation alone (clamp to epsilon = 1e-5, shared
  masks); ``token_eval``, ``ball_eval``: both in eval mode (no dropout at all), a
  check on the shared masks;
* ``token_independent``, ``old``: independent masks, with the token projection and
  with the committed behaviour before (ball clamp to 1e-5): their control is what
  dropout alone contributes;
* ``token_norm_*``: the token projection with shared masks at other
  ``token_norm``: how the term scales with the perturbation's size;
* ``perturbation_size_per_token``: for each projection, the perturbation the ascent
  finds next to the embeddings (per real token: L2 norms' ratio, infinity norms);
* ``bf16``: under ``torch.autocast("cpu", dtype=torch.bfloat16)`` with shared masks,
  ``before`` (the perturbed passes under the caller's autocast, as the old code ran
  them) and ``after`` (autocast off in them, now): of the perturbation's coordinates
  where a Linear's float32 input differs between the clean and the perturbed pass,
  the fraction where the input it computes with (rounded to bf16 under autocast)
  does not, at the first Linear (the perturbed embeddings) and averaged over all;
  the relative error of the perturbation as the first Linear sees it; and R_s from
  the same passes.

Writes ``bench/results/smart_decomposition.json``.
"""

from __future__ import annotations

import dataclasses
import os
import time

import common
import numpy as np
import torch
import yaml
from torch import nn

COURSE_FILES = {"sst": "ids-sst-train.csv", "quora": "quora-dev.csv", "sts": "sts-train.csv"}
DATA = common.REPO.parent / "shared" / "data" / "cs224n"
TOKEN_NORMS = (0.1, 0.3, 1.0, 3.0)
TARGET_S = 120.0  # seconds on the project's 2-core CPU


def load_batches(task: str, vocab, count: int, size: int, max_length: int, skip_ids: dict):
    """``count`` cross-encoder batches of ``size`` rows: the course file's first rows."""
    from minbert.data.batches import TokenizedTable
    from minbert.data.csvfile import read_task_csv
    from minbert.data.multitask import TaskData
    from minbert.data.tokenize import load_tokenizer, tokenize_table

    frame = read_task_csv(DATA / COURSE_FILES[task], task, skip_ids=skip_ids.get(COURSE_FILES[task]))
    frame = frame.head(count * size).reset_index(drop=True)
    arrow, _ = tokenize_table(frame, task, load_tokenizer(vocab), max_length)
    data = TaskData(task, TokenizedTable.from_arrow(arrow), siamese=False)
    return data, [data.batch(np.arange(i * size, (i + 1) * size)) for i in range(count)]


class LinearInputs:
    """Forward hooks on every ``nn.Linear``: each call's input, as the Linear computes
    with it (rounded to autocast's dtype when autocast is on at that call)."""

    def __init__(self, model: nn.Module):
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.handles = [
            m.register_forward_pre_hook(self.hook) for m in model.modules() if isinstance(m, nn.Linear)
        ]

    def hook(self, module, args):
        x = args[0].detach()
        seen = x.to(torch.get_autocast_dtype("cpu")) if torch.is_autocast_enabled("cpu") else x
        self.calls.append((x.float(), seen.float()))

    def take(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        calls, self.calls = self.calls, []
        return calls

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def vanished(clean: list, perturbed: list) -> tuple[float, float]:
    """Of the coordinates where a Linear's float32 input differs between the clean and
    the perturbed pass, the fraction where the input it computes with does not: at
    the first Linear (the perturbed embeddings themselves) and over all of them."""
    fractions = []
    for (x32, xc), (y32, yc) in zip(clean, perturbed, strict=True):
        moved = x32 != y32
        if moved.any():
            fractions.append(((xc == yc) & moved).sum().item() / moved.sum().item())
    return fractions[0], float(np.mean(fractions))


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=3, help="batches per task")
    p.add_argument("--batch-size", type=int, default=8, help="examples per batch (the cpu scale's)")
    # Batches of 8 x ~60 tokens through a 384-wide encoder: a second thread gains little,
    # and where other jobs share the 2 cores its barrier waits cost a lot (measured at
    # load average 5: 300-490 s with torch's 2 threads, 75 s with 1, same numbers).
    p.set_defaults(threads=1)
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)
    if args.quick:
        args.batches = 1
    started = time.perf_counter()

    from minbert.model.bert import BertModel
    from minbert.model.checkpoint import resolve_checkpoint
    from minbert.model.dropout import MaskTape
    from minbert.model.multitask import MultitaskBert
    from minbert.settings import SmartSettings
    from minbert.tasks import MULTITASK_TASKS, TASKS
    from minbert.train.smart import (
        adversarial_perturbation,
        divergence,
        initial_noise,
        smoothness_terms,
    )

    params = yaml.safe_load((common.REPO / "params.yaml").read_text(encoding="utf-8"))
    cpu = params["scales"]["cpu"]
    directory = resolve_checkpoint(params["checkpoint"])
    torch.manual_seed(args.seed)
    model = MultitaskBert(
        BertModel.from_pretrained(directory),
        "cross-encoder",
        "cross-encoder",
        cpu["multitask"]["dropout"],
        cpu["pooling"],
        params["sts_output"],
    ).train()
    model.requires_grad_(False)  # measured, not trained: the ascent needs the input's gradient only
    skip = params["data"]["skip_ids"]
    batches = {
        t: load_batches(
            t, directory / "vocab.txt", args.batches, args.batch_size, cpu["max_length"][t], skip
        )[1]
        for t in MULTITASK_TASKS
    }
    # One random start per batch, shared by every variant.
    hidden = model.encoder.config.hidden_size
    cases = [
        (t, b, initial_noise(torch.zeros(*b.ids.shape, hidden), SmartSettings().noise_std, gen))
        for t in MULTITASK_TASKS
        for i, b in enumerate(batches[t])
        for gen in [torch.Generator().manual_seed(args.seed + i)]
    ]

    def forward_fn(task, batch, bf16_inside: bool):
        """The model's pass; with ``bf16_inside``, autocast turned back on inside the
        perturbed passes (which turn it off): the old code's bf16 perturbed passes."""

        def run(e):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_inside):
                return model(task, batch, e)

        return run

    def terms(task, batch, start, settings, *, eval_mode=False, bf16=False, bf16_inside=False):
        """R_s and its control for one batch, from the same global random state."""
        torch.manual_seed(args.seed)
        model.train(not eval_mode)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            embedded = model.embed(batch)
            masks = MaskTape() if settings.dropout_masks == "shared" else None
            _, loss, control = smoothness_terms(
                forward_fn(task, batch, bf16_inside),
                embedded,
                TASKS[task].head_output,
                settings,
                start=start,
                masks=masks,
            )
        model.train()
        return loss.item(), control.item()

    def per_task(settings, **kw) -> dict:
        values = {t: [] for t in MULTITASK_TASKS}
        for t, b, s in cases:
            values[t].append(terms(t, b, s, settings, **kw))
        return {
            t: {
                "adversarial": float(np.mean([v[0] for v in vs])),
                "adversarial_control": float(np.mean([v[1] for v in vs])),
            }
            for t, vs in values.items()
        }

    default = SmartSettings()
    variants = {
        # (c) the default: token projection, shared masks; its R_s is the perturbation alone.
        "default": (default, {}),
        # (a) the perturbation alone: shared masks, and eval mode (no dropout at all).
        "ball_shared": (dataclasses.replace(default, projection="ball"), {}),
        "token_eval": (default, {"eval_mode": True}),
        "ball_eval": (dataclasses.replace(default, projection="ball"), {"eval_mode": True}),
        # (b) dropout alone is the control of the independent variants; (d) the old code.
        "token_independent": (dataclasses.replace(default, dropout_masks="independent"), {}),
        "old": (dataclasses.replace(default, projection="ball", dropout_masks="independent"), {}),
        **{
            f"token_norm_{n:g}": (dataclasses.replace(default, token_norm=n), {})
            for n in TOKEN_NORMS
            if n != default.token_norm
        },
    }
    seconds: dict = {"setup": time.perf_counter() - started}
    results: dict = {"variants": {}, "settings": {}, "seconds_per_part": seconds}
    for name, (settings, kw) in variants.items():
        began = time.perf_counter()
        results["variants"][name] = per_task(settings, **kw)
        results["settings"][name] = {**dataclasses.asdict(settings), **kw}
        seconds[name] = time.perf_counter() - began
    v = results["variants"]
    common.table(
        "R_s per task (mean over batches)",
        [
            "task",
            "ball, shared (paper's perturbation alone)",
            "dropout alone",
            "old",
            "default",
            "default control",
        ],
        [
            [
                t,
                f"{v['ball_shared'][t]['adversarial']:.2e}",
                f"{v['old'][t]['adversarial_control']:.2e}",
                f"{v['old'][t]['adversarial']:.2e}",
                f"{v['default'][t]['adversarial']:.2e}",
                f"{v['default'][t]['adversarial_control']:.1e}",
            ]
            for t in MULTITASK_TASKS
        ],
    )

    # How big each projection's perturbation is next to the embeddings it perturbs:
    # per real token, the ratio of L2 norms (median over tokens) and the infinity norms.
    began = time.perf_counter()
    sizes: dict = {}
    for projection in ("token", "ball"):
        settings = dataclasses.replace(default, projection=projection)
        ratios, noise_inf, embedding_inf = [], [], []
        for t, b, s in cases:
            torch.manual_seed(args.seed)
            embedded = model.embed(b)
            masks = MaskTape()
            fn = forward_fn(t, b, False)
            noise, _ = adversarial_perturbation(
                fn, embedded, TASKS[t].head_output, settings, start=s, masks=masks
            )
            real = b.mask.bool()
            ratios.append((noise.norm(dim=-1) / embedded.norm(dim=-1))[real])
            noise_inf.append(noise.abs().amax(-1)[real])
            embedding_inf.append(embedded.abs().amax(-1)[real])
        sizes[projection] = {
            f"{name}_median": torch.cat(values).median().item()
            for name, values in (
                ("l2_ratio_to_embedding", ratios),
                ("perturbation_inf_norm", noise_inf),
                ("embedding_inf_norm", embedding_inf),
            )
        }
    results["perturbation_size_per_token"] = sizes
    seconds["sizes"] = time.perf_counter() - began

    # (e) bf16: what of the perturbation reaches each Linear, and R_s, before (the
    # perturbed passes under the caller's autocast) and after (autocast off in them).
    bf16: dict = {}
    began = time.perf_counter()
    hooks = LinearInputs(model)
    for projection in ("ball", "token"):
        settings = dataclasses.replace(default, projection=projection)
        for when, inside in (("before", True), ("after", False)):
            cells = {t: [] for t in MULTITASK_TASKS}
            for t, b, s in cases:
                torch.manual_seed(args.seed)
                fn = forward_fn(t, b, inside)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    embedded = model.embed(b)
                    masks = MaskTape()

                    def run(x, fn=fn, masks=masks):
                        # A perturbed pass as smart.py runs it (autocast off, masks replayed).
                        with torch.no_grad(), masks.play(), torch.autocast("cpu", enabled=False):
                            return fn(x).float()

                    hooks.take()
                    clean = run(embedded)
                    clean_calls = hooks.take()
                    noise, _ = adversarial_perturbation(
                        fn, embedded, TASKS[t].head_output, settings, start=s, masks=masks
                    )
                    perturbed = run(embedded + noise)
                    calls = hooks.take()[-len(clean_calls) :]  # the last pass's, after the ascent's
                first, every = vanished(clean_calls, calls)
                (x32, x_seen), (y32, y_seen) = clean_calls[0], calls[0]
                error = ((y_seen - x_seen) - (y32 - x32)).norm() / (y32 - x32).norm()
                r_s = divergence(perturbed, clean, TASKS[t].head_output).item()
                cells[t].append((first, every, error.item(), r_s))
            bf16[f"{projection}_{when}"] = {
                "vanished_first_linear": float(np.mean([c[0] for cs in cells.values() for c in cs])),
                "vanished_mean_over_linears": float(np.mean([c[1] for cs in cells.values() for c in cs])),
                "relative_error_first_linear": float(np.mean([c[2] for cs in cells.values() for c in cs])),
                "adversarial": {t: float(np.mean([c[3] for c in cs])) for t, cs in cells.items()},
            }
    hooks.remove()
    seconds["bf16"] = time.perf_counter() - began
    results["bf16"] = bf16
    common.table(
        "bf16 autocast, shared masks: the perturbation as the Linear layers compute with it",
        [
            "projection, path",
            "vanished, first Linear",
            "mean over Linears",
            "relative error",
            *(f"R_s {t}" for t in MULTITASK_TASKS),
        ],
        [
            [
                k,
                f"{r['vanished_first_linear']:.3f}",
                f"{r['vanished_mean_over_linears']:.3f}",
                f"{r['relative_error_first_linear']:.3f}",
                *(f"{r['adversarial'][t]:.2e}" for t in MULTITASK_TASKS),
            ]
            for k, r in bf16.items()
        ],
    )

    elapsed = time.perf_counter() - started
    results.update(
        checkpoint=params["checkpoint"],
        heads="cross-encoder",
        pooling=cpu["pooling"],
        head_dropout=cpu["multitask"]["dropout"],
        encoder_dropout=model.encoder.config.hidden_dropout_prob,
        batches_per_task=args.batches,
        batch_size=args.batch_size,
        batch_shapes={t: [list(b.ids.shape) for b in batches[t]] for t in MULTITASK_TASKS},
        seconds=elapsed,
        cpu_seconds=time.process_time(),
        load_average_at_end=list(os.getloadavg()),
    )
    targets = [
        common.target(
            f"default, {t}: control / R_s (0: all of the term is the perturbation's)",
            v["default"][t]["adversarial_control"] / v["default"][t]["adversarial"],
            "<=",
            1e-6,
        )
        for t in MULTITASK_TASKS
    ] + [
        common.target(
            "bf16, after: fraction of the perturbation vanishing at the first Linear",
            bf16["token_after"]["vanished_first_linear"],
            "<=",
            0.0,
        ),
        # Wall time depends on what else shares the CPU: load averages are recorded.
        common.target("runtime (s)", elapsed, "<=", TARGET_S),
    ]
    common.finish("smart_decomposition", args, results, targets)


if __name__ == "__main__":
    main()
