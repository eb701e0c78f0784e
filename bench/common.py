"""Shared helpers of the benchmark scripts in ``bench/``.

* timing: :func:`measure` runs several candidates interleaved (warm-up, then
  ``repeats`` rounds of one call each) and keeps the median of ``time.perf_counter``;
  interleaving spreads slow drifts of the machine (thermal, other processes) evenly;
* the CPU's measured matmul peak (:func:`matmul_peak`) and a description of the
  machine (:func:`machine`);
* results: a rich table on stdout, and ``bench/results/<name>.json`` holding the
  exact command line, the machine, the results and every target, met or missed
  (:func:`finish`). ``--quick`` smoke runs write ``<name>.quick.json`` instead, so
  they never overwrite a real measurement;
* the multitask pieces shared by ``multitask_epoch.py`` and ``step_overhead.py``:
  the tokenised training tables of the pipeline and :class:`MultitaskRunner`, which
  runs the package's own training step on them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TOKENIZED = REPO / "data" / "tokenized"
CPU = torch.device("cpu")
# Redirected to a file, rich would wrap tables at 80 columns: use a wide fixed width.
console = Console() if Console().is_terminal else Console(width=160)
_started: dict = {}


# ----------------------------------------------------------------------------- options


def parser(description: str) -> argparse.ArgumentParser:
    """Options every script shares; each script adds its own sizes."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes and few repeats: a smoke run, not a measurement"
    )
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (median is kept)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls before timing")
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own choice)"
    )
    p.add_argument("--seed", type=int, default=11711)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the steps run")
    return p


def synced(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """``fn`` followed by waiting for the device: a GPU call is timed to its end."""
    if device.type != "cuda":
        return fn

    def run():
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return run


def setup(
    args: argparse.Namespace, *, repeats: int, warmup: int, quick_repeats: int = 2, quick_warmup: int = 1
) -> None:
    """Fill in default repeats, set the thread count and every seed; note the start."""
    _started.update(
        started=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        load_average_at_start=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    )
    if args.repeats is None:
        args.repeats = quick_repeats if args.quick else repeats
    if args.warmup is None:
        args.warmup = quick_warmup if args.quick else warmup
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)


# ----------------------------------------------------------------------------- timing


@dataclass
class Timing:
    samples: list[float]  # seconds per call

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def as_dict(self) -> dict:
        return {
            "median_s": self.median,
            "min_s": min(self.samples),
            "max_s": max(self.samples),
            "samples_s": self.samples,
        }


def measure(fns: dict[str, Callable[[], object]], *, warmup: int, repeats: int) -> dict[str, Timing]:
    """Time each callable: ``warmup`` untimed calls each, then ``repeats`` rounds in
    which every callable runs once (interleaved). Returns the per-call samples."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: Timing(s) for name, s in samples.items()}


def matmul_peak(n: int = 2048, repeats: int = 10) -> dict:
    """The CPU's fp32 matmul throughput at the current thread count: best of
    ``repeats`` timed ``n x n @ n x n`` products (2 n^3 FLOP each), after a warm-up."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    timing = measure({"mm": lambda: torch.mm(a, b, out=out)}, warmup=2, repeats=repeats)["mm"]
    best = min(timing.samples)
    return {"size": n, "flop_per_s": 2 * n**3 / best, "best_s": best, "median_s": timing.median}


def machine() -> dict:
    """What a result needs to be read against: CPU, cores, threads, versions, load."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if "transformers" in sys.modules:
        info["transformers"] = sys.modules["transformers"].__version__
    return info


# ----------------------------------------------------------------------------- results


def target(name: str, measured: float, op: str, threshold: float) -> dict:
    """A target and how it fared; ``slack`` > 0 means met by that much (same unit)."""
    if op not in (">=", "<="):
        raise ValueError(op)
    slack = measured - threshold if op == ">=" else threshold - measured
    return {
        "target": name,
        "measured": measured,
        "op": op,
        "threshold": threshold,
        "met": slack >= 0,
        "slack": slack,
    }


def table(title: str, header: list[str], rows: list[list]) -> None:
    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*(str(x) for x in row))
    console.print(t)


def finish(name: str, args: argparse.Namespace, results: dict, targets: list[dict]) -> Path:
    """Print the targets, write ``bench/results/<name>.json`` (``<name>_cuda.json`` for a
    ``--device cuda`` run, beside the CPU's); returns its path."""
    if getattr(args, "device", "cpu") == "cuda":
        name += "_cuda"
    table(
        "targets",
        ["target", "measured", "required", "met", "slack"],
        [
            [
                t["target"],
                f"{t['measured']:.3f}",
                f"{t['op']} {t['threshold']}",
                "[green]yes[/]" if t["met"] else "[red]NO[/]",
                f"{t['slack']:+.3f}",
            ]
            for t in targets
        ],
    )
    if args.quick:
        console.print("[yellow]--quick: tiny sizes, a smoke run; the numbers mean nothing[/]")
    record = {
        "benchmark": name,
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "cwd": os.getcwd(),
        **_started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "args": vars(args),
        "machine": machine(),
        "results": results,
        "targets": targets,
        "all_targets_met": all(t["met"] for t in targets),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'.quick' if args.quick else ''}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {path.relative_to(REPO)}")
    return path


# ----------------------------------------------------------------------------- multitask


def multitask_settings(config: str, scale: str):
    """The pipeline's settings of ``config`` at ``scale``, from params.yaml and the data
    stage's Quora split (the official one's sizes when no data is prepared)."""
    from minbert.pipeline import params as params_module

    params = params_module.load(REPO / "params.yaml")
    params["scale"] = scale
    manifest = REPO / "data" / "prepared" / "manifest.json"
    split = json.loads(manifest.read_text())["quora_split"] if manifest.is_file() else {"kind": "official"}
    return params, params_module.multitask_settings(params, config, split)


def validation_run(settings, checkpoint: str, tables: dict, features, observer=None):
    """``settings`` trained as its stage would from ``checkpoint`` (params.yaml's name), on
    the CPU, scoring validation and the training slices only (no dev): the run's result.
    ``observer``: a ``MultitaskObserver`` that watches the steps and epochs."""
    import minbert.train.multitask as multitask
    from minbert.model.bert import BertModel
    from minbert.model.checkpoint import resolve_checkpoint

    encoder = BertModel.from_pretrained(resolve_checkpoint(checkpoint))
    return multitask.train_multitask(
        settings, encoder, tables, CPU, score_dev=False, features=features, observer=observer
    )


# What a run realises of its settings rather than sets (a run record states them beside).
REALIZED = ("train_examples", "validation_examples")


def validation_settings(base, seed: int, quick: bool):
    """``base`` as a validation-only run of ``seed`` trains it: no test predictions;
    ``quick``: 32 training and validation rows per task, a smoke run."""
    import dataclasses

    base = dataclasses.replace(base, test_predictions=False, seed=seed)
    if not quick:
        return base
    return dataclasses.replace(
        base,
        train_examples=dict.fromkeys(base.train_examples, 32),
        validation_examples=dict.fromkeys(base.validation_examples, 32),
    )


def smart_settings(config: str, seed: int, quick: bool):
    """params.yaml and ``config``'s cpu-scale settings as a validation-only run of ``seed``
    trains them (``validation_settings``); exits when the configuration has no SMART."""
    params, base = multitask_settings(config, "cpu")
    if not base.smart:
        raise SystemExit(f"{config}: SMART is off in this configuration")
    return params, validation_settings(base, seed, quick)


def ran_at(settings, result) -> dict:
    """The settings a validation run ran at, in a run record's form (as the report reads a
    stage's run, ``minbert.report.comparisons.ran_at``): no seed, the batches and the
    example counts it realised."""
    from minbert.report.comparisons import STATED_BESIDE
    from minbert.runs.record_parts import RecordedSettings

    stated = {
        "batch_size": dict(settings.batch_size),
        "train_examples": result.train_examples,
        "validation_examples": result.validation_examples,
    }
    return {**RecordedSettings.of(settings).as_dict(), **{k: stated[k] for k in STATED_BESIDE}}


def shared_ran_at(runs: list[dict]) -> tuple[dict, set[str]]:
    """What every run ran at, and which realised example counts differ by run (Quora's
    validation rows are whole question groups: their count may differ by seed); exits when
    anything else differs."""
    differ = {k for r in runs for k, v in r.items() if v != runs[0][k]}
    if differ - set(REALIZED):
        sys.exit(f"the runs ran at different settings: {sorted(differ - set(REALIZED))}")
    return {k: v for k, v in runs[0].items() if k not in differ}, differ


def side_by_side(point: Callable, work: list[tuple], jobs: int) -> list:
    """``point(*args)`` for every ``args`` in ``work``, ``jobs`` at a time in fresh (spawned)
    processes sharing the cores, in the order of ``work``."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        return list(pool.map(point, *zip(*work)))


def probe_features(directory: Path | None = None):
    """The features stage's output (data/features, or ``directory`` where the stage's code
    wrote it for another seed), opened for the checkpoint and pooling its settings name
    (data/settings/features.json)."""
    from minbert.model.checkpoint import describe_checkpoint, resolve_checkpoint
    from minbert.train.head_warmup import ProbeFeatures

    made = json.loads((REPO / "data" / "settings" / "features.json").read_text(encoding="utf-8"))
    described = describe_checkpoint(made["checkpoint"], resolve_checkpoint(made["checkpoint"]))
    return ProbeFeatures(directory or REPO / "data" / "features", described["sha256"], made["pooling"])


def training_tables() -> dict:
    """The pipeline's tokenised tables (``data/tokenized``), as the stages load them."""
    from minbert.pipeline.multitask import load_tables
    from minbert.tasks import MULTITASK_TASKS

    missing = [
        f"data/tokenized/{t}-train.parquet"
        for t in MULTITASK_TASKS
        if not (TOKENIZED / f"{t}-train.parquet").is_file()
    ]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: run `dvc repro tokenize` first")
    return load_tables(TOKENIZED)


class MultitaskRunner:
    """The model and the training subsets of a configuration, built by the functions
    the multitask stage uses (``minbert.train.start.build_model`` and
    ``run_data``), and the pipeline's own training step over them
    (``MultitaskStep``: batch padding, each task's objective with SMART's terms when
    on, the backward pass (summed or PCGrad's), clipping, the optimizer step, the
    teacher update).

    Left out: the progress bar and the per-epoch evaluation.
    """

    def __init__(self, settings, checkpoint: str, device: torch.device = CPU):
        from minbert.model.bert import BertModel
        from minbert.model.checkpoint import resolve_checkpoint
        from minbert.train.start import build_model, run_data

        encoder = BertModel.from_pretrained(resolve_checkpoint(checkpoint))
        self.device = device
        self.model = build_model(settings, encoder, device).train()
        self.data = run_data(settings, self.model, training_tables()).train

    @property
    def lengths(self) -> dict[str, np.ndarray]:
        return {t: d.lengths for t, d in self.data.items()}

    def step(self, settings):
        """The pipeline's training step with ``settings`` (gradient mode, SMART) on
        this model; each call gives a step with its own optimizer state."""
        from minbert.train.multitask_step import MultitaskStep

        return MultitaskStep(settings, self.model, self.data, self.device)

    def batches(self, rows_by_task: dict[str, np.ndarray]) -> list[tuple]:
        """(task, padded batch) of one step, as the step pads them."""
        return [(task, self.data[task].batch(rows)) for task, rows in rows_by_task.items()]
