"""The smoke call, before a study spends its GPU minutes (docs/gpu-node.md): one short call
that runs a PCGrad + SMART stage and a round-robin stage of the plan on a slice of their
training rows, checks that their losses are finite and SMART's control term is zero (the
dropout masks replayed on the device), and measures what the study's calls are cut from
(``minbert.offline.calls``): the seconds of a training step and of a scoring batch, the
aten operators of each on this device, each stage's start-up and the stages every call
reruns. It writes ``smoke.json`` into the call's folder, never a stage's results."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

from minbert.offline.bundle import read_bundle
from minbert.offline.plan import by_name, select
from minbert.results import HISTORY, run_log
from minbert.runs.training import MultitaskRunFile, read_run

SMOKE_FORMAT = "minbert-gpu-smoke/1"
SMOKE_FILE = "smoke.json"
# The stages it runs, each a kind of step the study's costliest stages take.
SMOKE_STAGES = {"multitask@best": "PCGrad + SMART", "multitask@baseline": "round-robin"}
SLICE_BATCHES = 8  # batches of each task in a smoke stage's one epoch
SLICE_SCORED = 256  # rows of each history slice the smoke stages score
TIMED_STEPS = 12  # training steps timed in-process, after two untimed ones
COUNTED_STEPS = 2  # of them, counted operator by operator (slower: not timed)
MEASURE_MINUTES = 1.5  # of the call's --deadline, kept for the in-process timing
# SMART's control with the masks replayed: 0 up to the rounding of a stacked batch (the
# divergence of two outputs equal but for float32 rounding is of order 1e-12); masks not
# replayed make it dropout's own effect, of the order of the term itself (1e-2 here).
CONTROL_TOLERANCE = 1e-5


class OperatorCount(TorchDispatchMode):
    """Counts every aten operator dispatched while active (by name in ``ops``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def counted(fn) -> int:
    """Operators ``fn()`` dispatches."""
    counter = OperatorCount()
    with counter:
        fn()
    return sum(counter.ops.values())


def slice_params(params: dict) -> None:
    """The study's params.yaml cut to the smoke's slice: one epoch of ``SLICE_BATCHES``
    batches of each task, history slices of ``SLICE_SCORED`` rows; batches, heads and
    every other setting as the study runs them."""
    sized = params["scales"][params["scale"]]["multitask"]
    sized["epochs"] = 1
    sized["train_examples"] = {t: b * SLICE_BATCHES for t, b in sized["batch_size"].items()}
    sized["history_examples"] = {"dev": SLICE_SCORED, "train": SLICE_SCORED}


def _work_copy(repo: Path, bundle: Path, plan: dict, work: Path) -> Path:
    """The files the smoke stages run from, copied into ``work`` (the repository's own
    outputs are never touched), the bundle linked beside them."""
    stages = by_name(plan)
    names = {n for s in select(plan, list(SMOKE_STAGES)) for n in stages[s]["sources"]}
    for name in sorted(names | {"params.yaml"}):
        if (repo / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, work / name)
    (work / "offline-bundle").symlink_to(bundle, target_is_directory=True)
    return work / "offline-bundle"


def _history_checks(history_file: Path) -> dict:
    """The smoke stage's own log: its epoch's mean losses finite, SMART's control zero."""
    import numpy as np
    import pandas as pd

    trained = pd.read_csv(history_file).query("epoch > 0")
    parts = trained.filter(regex=r"^train_(loss|adversarial|bregman)")
    control = trained.filter(regex=r"^train_adversarial_control_")
    return {
        "losses_finite": bool(len(parts.columns)) and bool(np.isfinite(parts.to_numpy(float)).all()),
        "smart_control": float(control.abs().to_numpy().max()) if len(control.columns) else None,
    }


def _measure(work: Path, config: str, checkpoint: Path) -> dict:
    """Seconds and operators of this device's training steps and scoring batches of
    ``config``, in-process, on the smoke's tokenised tables and settings."""
    import numpy as np
    import torch

    from minbert.data.multitask import epoch_steps
    from minbert.device import choose_device
    from minbert.evaluate.multitask import evaluate_multitask
    from minbert.model.bert import BertModel
    from minbert.pipeline.entry import read_settings
    from minbert.pipeline.multitask import load_tables
    from minbert.settings import MultitaskSettings, RunContext
    from minbert.train.multitask_step import MultitaskStep
    from minbert.train.smart import LOSS_PARTS
    from minbert.train.start import build_model, run_data

    resolved = read_settings(work / "data" / "settings" / "multitask" / f"{config}.json")
    settings = MultitaskSettings.from_dict(resolved["settings"])
    device = choose_device(RunContext.of(resolved, "config").device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    model = build_model(settings, BertModel.from_pretrained(checkpoint), device)
    data = run_data(settings, model, load_tables(work / "data" / "tokenized"))
    step = MultitaskStep(settings, model, data.train, device)
    lengths = {t: d.lengths for t, d in data.train.items()}
    one_task = settings.gradient == "round-robin"
    plan = []
    while len(plan) < 2 + TIMED_STEPS + COUNTED_STEPS:
        rng, merged = np.random.default_rng(len(plan)), settings.batches_per_step
        plan += epoch_steps(
            lengths, settings.batch_size, rng, one_task_per_step=one_task, batches_per_step=merged
        )
    losses = [step(plan[0])[0], step(plan[1])[0]]  # the optimizer's state is made on the first
    sync()
    began = time.perf_counter()
    for rows in plan[2 : 2 + TIMED_STEPS]:
        losses.append(step(rows)[0])
    sync()
    step_seconds = (time.perf_counter() - began) / TIMED_STEPS
    counted_steps = plan[2 + TIMED_STEPS : 2 + TIMED_STEPS + COUNTED_STEPS]
    step_ops = counted(lambda: [step(rows) for rows in counted_steps]) / COUNTED_STEPS
    step.flush()
    losses = torch.stack(losses).cpu()
    control = losses[:, :, LOSS_PARTS.index("adversarial_control")]

    sst = {"sst": data.validation["sst"]}
    size = settings.eval_batch_size
    evaluate_multitask(model, sst, size, device)  # warm
    sync()
    began = time.perf_counter()
    evaluate_multitask(model, sst, size, device)
    sync()
    scoring_batches = -(-len(data.validation["sst"]) // size)
    scoring_seconds = (time.perf_counter() - began) / scoring_batches
    scoring_ops = counted(lambda: evaluate_multitask(model, sst, size, device)) / scoring_batches
    return {
        "step": {"seconds": step_seconds, "ops": step_ops, "us_per_op": 1e6 * step_seconds / step_ops},
        "sst_scoring_batch": {
            "seconds": scoring_seconds,
            "ops": scoring_ops,
            "us_per_op": 1e6 * scoring_seconds / scoring_ops,
        },
        "losses_finite": bool(torch.isfinite(losses).all()),
        "smart_control": float(control.abs().max()) if settings.smart else None,
    }


def smoke_call(repo: Path, bundle: Path, out: Path, deadline_minutes: float | None = None, log=print) -> dict:
    """Run the smoke call (see the module) with the bundle's plan; write ``smoke.json``
    into ``out`` and return it. ``passed``: the stages finished, their losses are finite
    and SMART's control term is zero."""
    import json

    from minbert.offline.runner import device_description, run_call

    began = time.monotonic()
    repo, bundle = Path(repo).resolve(), Path(bundle).resolve()
    plan = read_bundle(bundle)["plan"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="minbert-smoke-") as scratch:
        work = Path(scratch) / "repo"
        work.mkdir()
        linked = _work_copy(repo, bundle, plan, work)
        index = run_call(
            work, linked, Path(scratch) / "packed", list(SMOKE_STAGES),
            None if deadline_minutes is None else max(deadline_minutes - MEASURE_MINUTES, 0), log=log,
            params_edit=slice_params, lanes=1, estimated=False,
        )  # fmt: skip
        seconds = {s["stage"]: s["seconds"] for s in index["stages"]}
        stages = {}
        for name, kind in SMOKE_STAGES.items():
            config = name.split("@", 1)[1]
            stage = {"kind": kind, "seconds": seconds.get(name)}
            if name in seconds:
                run = read_run(MultitaskRunFile, work / "metrics" / "multitask" / f"{config}.json")
                history = run_log(work / "metrics" / "multitask", config, HISTORY)
                stage.update(steps=run.steps, **_history_checks(history))
                log(f"smoke: timing {name}'s steps and scoring in-process")
                stage["measured"] = _measure(work, config, linked / "checkpoint")
            stages[name] = stage
    problems = [f"{f['stage']}: {f['reason']}" for f in index["failed"] + index["not_run"]]
    for name, stage in stages.items():
        for found in (stage, stage.get("measured", {})):
            if found.get("losses_finite") is False:
                problems.append(f"{name}: a training loss is not finite")
            if (found.get("smart_control") or 0.0) > CONTROL_TOLERANCE:
                problems.append(f"{name}: SMART's control term is {found['smart_control']:.3g}, not 0")
    smoke = {
        "format": SMOKE_FORMAT,
        "commit": index["commit"],
        "overrides": plan["overrides"],
        "started": index["started"],
        **device_description(),
        "call_start_seconds": round(sum(s for n, s in seconds.items() if n not in SMOKE_STAGES), 1),
        "slice": {"batches": SLICE_BATCHES, "timed_steps": TIMED_STEPS, "counted_steps": COUNTED_STEPS},
        "stages": stages,
        "seconds": round(time.monotonic() - began, 1),
        "problems": problems,
        "passed": not problems,
    }
    (out / SMOKE_FILE).write_text(json.dumps(smoke, indent=2) + "\n", encoding="utf-8")
    return smoke


def summary(smoke: dict) -> list[str]:
    """What the call prints of ``smoke.json``: each stage with its seconds and, where it
    finished, a step's seconds and operators; a stage stopped or failed has neither."""
    lines = []
    for name, ran in smoke["stages"].items():
        step = ran.get("measured", {}).get("step")
        rate = (
            f", a step {step['seconds'] * 1e3:.0f} ms ({step['us_per_op']:.1f} us per operator)"
            if step
            else ""
        )
        took = "did not finish" if ran["seconds"] is None else f"{ran['seconds']} s"
        lines.append(f"  {name} ({ran['kind']}): {took}{rate}")
    lines.append(f"{SMOKE_FILE}: {'passed' if smoke['passed'] else 'FAILED'} in {smoke['seconds']:.0f} s")
    lines += [f"  {problem}" for problem in smoke["problems"]]
    return lines
