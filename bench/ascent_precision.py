"""How much of SMART's ascent direction is float32 rounding, on the real encoder.

Not a timing: a measurement of ``minbert.train.smart`` on all-MiniLM-L6-v2 (params.yaml's
``checkpoint``) with the cross-encoder heads of ``best`` (heads drawn from ``--seed``, the
cpu scale's pooling and dropout), in training mode with shared dropout masks, on the first
``--batch-size`` rows of each task's course training file (as ``smart_decomposition.py``).

The ascent starts from N(0, sigma^2) noise (sigma = ``noise_std``, 1e-5 in the paper) and
follows the gradient, in the noise, of the divergence between the perturbed and the clean
output. The reference is that gradient in float64 (the model copied to float64), by
autograd through both passes. Two float32 ways of computing it are compared with it, by the
relative error of the gradient and by the largest change of its per-token direction (the
gradient over each token's infinity norm, which is what the ascent's step takes):

* ``differenced``: autograd through a perturbed and a clean float32 pass, as before:
  the output change it differentiates is ~sigma of the output, so float32's rounding
  (~1e-7 of the output) is a share ~1e-7/sigma of it, and another CPU's kernels round
  otherwise;
* ``linearised``: ``ascent_gradient`` (the output change as a forward-mode derivative,
  no difference taken).

Writes ``bench/results/ascent_precision.json``. About a minute on the 2-core CPU.
"""

from __future__ import annotations

import copy

import common
import torch
import yaml
from smart_decomposition import load_batches

from minbert.tasks import MULTITASK_TASKS


def gradient(net, dtype, linearised: bool, task, batch, kind, embedded, noise, masks) -> torch.Tensor:
    """The ascent's gradient at ``noise`` in ``dtype``: linearised (``ascent_gradient``), or
    by autograd through a perturbed and a clean pass (the masks replayed for both)."""
    from minbert.train.smart import ascent_gradient, divergence

    x, start = embedded.to(dtype), noise.to(dtype)
    if linearised:
        return ascent_gradient(lambda e: net(task, batch, e), x, start, kind, masks)[0].double()
    moved = start.clone().requires_grad_(True)
    with masks.play():
        clean = net(task, batch, x).detach()
    with masks.play():
        perturbed = net(task, batch, x + moved)
    return torch.autograd.grad(divergence(perturbed, clean, kind), moved)[0].double()


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--noise-std", type=float, action="append", help="sigma (repeat); default 1e-5, 1e-3")
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)

    from minbert.device import pin_cpu_kernels
    from minbert.model.bert import BertModel
    from minbert.model.checkpoint import resolve_checkpoint
    from minbert.model.dropout import MaskTape
    from minbert.model.multitask import MultitaskBert
    from minbert.tasks import TASKS as SPECS
    from minbert.train.smart import initial_noise

    pin_cpu_kernels()
    params = yaml.safe_load((common.REPO / "params.yaml").read_text(encoding="utf-8"))
    cpu = params["scales"]["cpu"]
    directory = resolve_checkpoint(params["checkpoint"])
    torch.manual_seed(args.seed)
    model = MultitaskBert(
        BertModel.from_pretrained(directory), "cross-encoder", "cross-encoder", cpu["multitask"]["dropout"],
        cpu["pooling"], params["sts_output"],
    ).train()  # fmt: skip
    model.requires_grad_(False)  # measured, not trained: the noise's gradient only
    reference_model = copy.deepcopy(model).double()
    sigmas = args.noise_std or [1e-5, 1e-3]
    skip = params["data"]["skip_ids"]

    def unit(grad: torch.Tensor) -> torch.Tensor:  # the ascent's per-token direction
        return grad / grad.abs().amax(-1, keepdim=True).clamp_min(1e-300)

    results: dict = {}
    for task in MULTITASK_TASKS:
        _, (batch,) = load_batches(
            task, directory / "vocab.txt", 1, args.batch_size, cpu["max_length"][task], skip
        )
        kind = SPECS[task].head_output
        results[task] = {}
        for sigma in sigmas:
            torch.manual_seed(args.seed)
            embedded = model.embed(batch).detach()
            noise = initial_noise(embedded, sigma, torch.Generator().manual_seed(args.seed))
            masks = MaskTape()

            case = (task, batch, kind, embedded, noise, masks)
            reference = gradient(reference_model, torch.float64, False, *case)
            row = {}
            for name, linearised in (("differenced", False), ("linearised", True)):
                found = gradient(model, torch.float32, linearised, *case)
                row[name] = {
                    "relative_error": ((found - reference).norm() / reference.norm()).item(),
                    "largest_direction_change": (unit(found) - unit(reference)).abs().max().item(),
                }
            results[task][f"{sigma:g}"] = row
    common.table(
        "SMART's ascent gradient against float64: relative error (largest per-token direction change)",
        ["task", "noise_std", "differenced (float32)", "linearised (float32)"],
        [
            [
                t,
                s,
                *(
                    f"{r[m]['relative_error']:.1e} ({r[m]['largest_direction_change']:.1e})"
                    for m in ("differenced", "linearised")
                ),
            ]
            for t, by_sigma in results.items()
            for s, r in by_sigma.items()
        ],
    )
    # At the paper's sigma (the smallest tried) the error is float32's; at larger ones it is
    # the second-order model's own, growing with sigma (the reference keeps every order).
    paper = f"{min(sigmas):g}"
    worst = max(by[paper]["linearised"]["relative_error"] for by in results.values())
    differenced = min(by[paper]["differenced"]["relative_error"] for by in results.values())
    targets = [
        common.target(
            f"linearised ascent gradient at sigma {paper}, largest relative error vs float64",
            worst,
            "<=",
            1e-4,
        ),
        common.target(
            f"differenced / linearised error at sigma {paper} (smallest task over largest)",
            differenced / worst,
            ">=",
            100,
        ),
    ]
    common.finish("ascent_precision", args, {"batch_size": args.batch_size, "tasks": results}, targets)


if __name__ == "__main__":
    main()
