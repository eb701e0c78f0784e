"""Do the committed results survive another CPU's rounding? Rerun stages under MKL's other branch.

Not a timing. A CPU of another vendor runs other matrix-product kernels: MKL honours its
AVX2 reproducibility branch on Intel CPUs only, so an Intel and an AMD machine round the
same products differently in the last bits (``minbert.device.CPU_KERNELS``). MKL's
``COMPATIBLE`` branch (SSE2, the one branch it runs alike on every vendor) rounds them
differently from its default here too, so rerunning a stage under ``MKL_CBWR=COMPATIBLE``
is that test on one machine: each ``--config`` (default: every multitask configuration of
params.yaml) is trained again by its stage script, with the command dvc.yaml gives it,
into a scratch folder, and its metrics file is compared with the committed one
(``metrics/multitask/<config>.json``, written at 4 decimals) number by number. Other
branches round otherwise than the stages' pinned AVX2 on some CPUs only (``AVX512`` on an
Intel CPU that has it, at full speed), so the bench first checks that ``--branch`` changes
a product's bits against the stages' own pins here, and records the committed numbers it
compared with (the report checks they are still current).

Needs ``dvc repro`` first (the tokenised tables, the features, the resolved settings).
Writes ``bench/results/cross_cpu.json``. About twice the stages' own time under COMPATIBLE
(its products are slower); about the stages' own under AVX512.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import yaml

from minbert.results import metrics_from_text

# A fixed matrix product's bytes, in a process of its own with the stages' own pins
# (minbert.device.pin_cpu_kernels: MKL reads MKL_CBWR at its first product).
PRODUCT = (
    "from minbert.device import pin_cpu_kernels; pin_cpu_kernels(); import hashlib, torch; "
    "torch.manual_seed(0); a, b = torch.randn(512, 384), torch.randn(384, 1536); "
    "print(hashlib.sha256((a @ b).numpy().tobytes()).hexdigest())"
)


def product_digest(branch: str | None) -> str:
    """The product's digest under ``branch``, or as a stage rounds it (None)."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env.update({"MKL_CBWR": branch} if branch else {})
    done = subprocess.run([sys.executable, "-c", PRODUCT], env=env, check=True, capture_output=True)
    return done.stdout.decode().strip()


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--config", action="append", help="a configuration (repeat); default: all")
    p.add_argument(
        "--branch",
        default="COMPATIBLE",
        help="MKL_CBWR for the rerun: one that rounds otherwise than the stages' pinned AVX2 "
        "(COMPATIBLE anywhere; AVX512 on an Intel CPU that has it, at full speed)",
    )
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)
    params = yaml.safe_load((common.REPO / "params.yaml").read_text(encoding="utf-8"))
    stage = yaml.safe_load((common.REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["multitask"]
    configs = args.config or list(params["configs"])
    rounds_otherwise = product_digest(args.branch) != product_digest(None)
    common.console.print(f"MKL_CBWR={args.branch} rounds a product otherwise here: {rounds_otherwise}")
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for config in configs:
            command = shlex.split(stage["do"]["cmd"].replace("${key}", config))
            command = [sys.executable, *command[1:]]  # the launcher: this Python, one process
            for flag in ("--metrics", "--predictions", "--models"):  # outputs to the scratch folder
                command[command.index(flag) + 1] = str(Path(scratch) / flag.strip("-"))
            env = {**os.environ, "MKL_CBWR": args.branch}
            common.console.print(f"[bold]{config}[/] under MKL_CBWR={args.branch}")
            started = time.perf_counter()
            subprocess.run(command, cwd=common.REPO, env=env, check=True, stdout=subprocess.DEVNULL)
            seconds = round(time.perf_counter() - started, 1)
            committed, rerun = (
                metrics_from_text(path.read_text(), str(path))
                for path in (
                    common.REPO / "metrics" / "multitask" / f"{config}.json",
                    Path(scratch) / "metrics" / f"{config}.json",
                )
            )
            results[config] = {
                "committed": committed,
                "seconds": seconds,  # the whole stage under the branch (set against stage_memory's)
                "identical": committed == rerun,
                "differences": {
                    k: [committed[k], rerun.get(k)] for k in committed if committed[k] != rerun.get(k)
                },
            }
    common.table(
        f"multitask metrics files rerun under MKL_CBWR={args.branch}",
        ["configuration", "identical to the committed file", "differences (committed, rerun)"],
        [[c, r["identical"], r["differences"] or ""] for c, r in results.items()],
    )
    identical = sum(r["identical"] for r in results.values())
    targets = [
        common.target("configurations reproduced to the written precision", identical, ">=", len(results))
    ]
    results = {"branch": args.branch, "rounds_otherwise": rounds_otherwise, "configs": results}
    common.finish("cross_cpu", args, results, targets)


if __name__ == "__main__":
    main()
