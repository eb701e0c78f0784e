"""Where a multitask stage spends its time: start-up, head warm-up, training steps, each
scoring pass and writing, in CPU seconds of one thread.

The stage (``minbert.pipeline.multitask.run``, the code `dvc repro` runs) for ``--config``,
on the tokenised tables, features and settings of the last `dvc repro` (``data/``), in
this process on one thread under cProfile with the process-time clock: seconds of one
thread's work, which other load on the machine does not change. Each phase is the
cumulative time of the function that does it (``warm_up_heads``; ``MultitaskStep.__call__``;
``evaluate_multitask`` by its caller: the scores before training and after every epoch,
the dev sets at the start, the kept epoch's dev sets, the test sets; ``_write``); the rest
of the stage is start-up (imports, loading the checkpoint and the tables, the resolved
settings). Target: the training steps at least 60% of the stage. Writes
``bench/results/stage_breakdown.json`` (each configuration's breakdown under its name);
``--name stage_breakdown_before`` for the same script run on the code before a change.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path

import common

TRAINING_SHARE = 0.6  # the target: training steps' share of the stage, at least


def _cumulative(stats: pstats.Stats, file_part: str, name: str) -> tuple[float, dict[str, float]]:
    """The function's cumulative seconds, and per caller (``file:function``) its share."""
    for (path, _, function), (_, _, _, total, callers) in stats.stats.items():
        if function == name and path.endswith(file_part):
            by_caller = {f"{Path(caller[0]).name}:{caller[2]}": entry[3] for caller, entry in callers.items()}
            return total, by_caller
    return 0.0, {}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["baseline", "best"])
    p.add_argument(
        "--name",
        default="stage_breakdown",
        help="the results file's name (stage_breakdown_before: the same script on the code before a change)",
    )
    args = p.parse_args()
    args.threads = 1
    common.setup(args, repeats=1, warmup=0)

    from minbert.pipeline import multitask
    from minbert.pipeline.entry import read_settings

    data = common.REPO / "data"
    results = {}
    for config in args.configs:
        resolved = read_settings(data / "settings" / "multitask" / f"{config}.json")
        with tempfile.TemporaryDirectory() as out:
            out = Path(out)
            profile = cProfile.Profile(time.process_time)
            began = time.process_time()
            profile.enable()
            multitask.run(
                resolved, data / "tokenized", data / "prepared" / "manifest.json", out / "metrics",
                out / "predictions", resume_dir=None, models=out / "models", features=data / "features",
            )  # fmt: skip
            profile.disable()
            total = time.process_time() - began
        stats = pstats.Stats(profile)
        warmup, _ = _cumulative(stats, "train/head_warmup.py", "warm_up_heads")
        training, _ = _cumulative(stats, "train/multitask_step.py", "__call__")
        scoring, callers = _cumulative(stats, "evaluate/multitask.py", "evaluate_multitask")
        writing, _ = _cumulative(stats, "pipeline/multitask.py", "_write")
        # evaluate_multitask's callers: the epochs' scores (``score`` from ``_slices``) and
        # the dev and test sets (``score`` from ``train_multitask``).
        score_of = {k: v for k, v in _cumulative(stats, "train/multitask.py", "score")[1].items()}
        phases = {
            "start-up": total - warmup - training - scoring - writing,
            "head warm-up": warmup,
            "training steps": training,
            "scoring: every epoch (validation, history slices)": score_of.get("multitask.py:_slices", 0.0),
            "scoring: dev at the start, the kept epoch, test": score_of.get(
                "multitask.py:train_multitask", 0.0
            ),
            "writing outputs": writing,
        }
        other = scoring - sum(v for k, v in phases.items() if k.startswith("scoring"))
        if abs(other) > 0.5:
            phases["scoring: elsewhere"] = other
        results[config] = {
            "cpu_seconds": round(total, 1),
            "phases": {k: round(v, 1) for k, v in phases.items()},
            "training_share": round(training / total, 3),
            "evaluate_multitask_callers": {k: round(v, 1) for k, v in callers.items()},
        }
        common.table(
            f"multitask@{config}: CPU seconds on one thread ({total:.0f} in all)",
            ["phase", "seconds", "share"],
            [[k, f"{v:.1f}", f"{v / total:.0%}"] for k, v in phases.items()],
        )
    common.finish(
        args.name,
        args,
        {
            "configs": results,
            "settings": {
                c: json.loads((data / "settings" / "multitask" / f"{c}.json").read_text())["settings"][
                    "train_examples"
                ]
                for c in args.configs
            },
        },
        [
            common.target(
                f"{c}: training steps' share of the stage", r["training_share"], ">=", TRAINING_SHARE
            )
            for c, r in results.items()
        ],
    )


if __name__ == "__main__":
    main()
