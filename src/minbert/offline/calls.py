"""The study cut into node calls: its stages in the order a GPU period should bring them
back, each call at most its ``--deadline`` at the worst estimate, the calls into periods
of at most ``PERIOD_MINUTES`` of device time (the first opening with the smoke call). A
stage's estimate is its aten operators, counted on the CPU at the study's scale
(``bench/results/<scale>_study_ops.json``, ``python bench/step_ops.py --study gpu``), at
a rate: assumed before a GPU was measured, then the smoke call's (``smoke.json``) or the
study's own calls'."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minbert.offline.runner import STOPPED_AT_DEADLINE

# The order a GPU period should bring the study back: zero-shot, Table 1, `baseline`,
# `best` and its ablations (Table 4), Table 3, then MLM (whose models never leave the
# node, so `mlm@*` and `multitask-mlm@*` share a call).
PRIORITY = [
    "zero-shot",
    "sentiment",
    "multitask@baseline",
    "multitask@best",
    "multitask@best-round-robin",
    "multitask@best-adamw",
    "multitask@best-no-smart",
    "multitask@best-summed",
    "multitask@best-round-robin-equal",
    "multitask@siamese-diff",
    "multitask@siamese-diff-prod",
    "multitask@cosine-sts",
    "multitask@concatenation",
    "mlm",
]
# A call's --deadline: a node command runs at most 10 minutes; one is left for the
# interpreter's start, the SIGTERM grace and packing what finished.
DEADLINE_MINUTES = 9.0
# Device minutes of a period a plan may spend (of 30: the machine's start for every call
# and the transfers are the rest).
PERIOD_MINUTES = 24.0
SMOKE_MINUTES = 6.0  # the smoke call's --deadline: the first call of the first period
WORST = 1.25  # the worst case over an estimate from a measured rate


@dataclass(frozen=True)
class Rate:
    """What a stage costs on the node: microseconds per operator counted on the CPU (of a
    training step, of a scoring batch), a stage's start-up, and the stages every call
    reruns before its own (prepare, resolve, tokenize, features)."""

    train_us_per_op: float
    scoring_us_per_op: float
    stage_start_s: float
    call_start_s: float
    worst: float  # the worst case's factor over the estimate
    source: str

    @classmethod
    def assumed(cls, us_per_op: float = 10.0) -> Rate:
        """Before any GPU was measured: ``us_per_op`` (a step this small is bound by kernel
        launches: 5 to 10 us each), generous start-ups, no further factor."""
        return cls(us_per_op, us_per_op, 30.0, 90.0, 1.0, f"assumed: {us_per_op:g} us per operator")

    @classmethod
    def measured(cls, smoke: dict, stages: dict[str, dict]) -> Rate:
        """From the smoke call: each measured step's seconds over the CPU count of its
        configuration's step (the slower of the two), the same for a scoring batch; a
        stage's start-up is its smoke stage's seconds less its steps (scoring and writing
        included: an upper bound); the stages before the smoke's, as the call's start."""
        ran = {n: s for n, s in smoke["stages"].items() if "measured" in s}
        if len(ran) < len(smoke["stages"]) or not smoke.get("passed", False):
            raise ValueError(
                f"the smoke call did not pass: {'; '.join(smoke['problems']) or 'no measurement'}"
            )
        train = max(s["measured"]["step"]["seconds"] / stages[n]["ops_per_step"] for n, s in ran.items())
        scoring = max(
            s["measured"]["sst_scoring_batch"]["seconds"] / stages[n]["sst_scoring_batch_ops"]
            for n, s in ran.items()
        )
        start = max(s["seconds"] - s["steps"] * s["measured"]["step"]["seconds"] for s in ran.values())
        return cls(
            train * 1e6,
            scoring * 1e6,
            max(start, 0.0),
            smoke["call_start_seconds"],
            WORST,
            f"the smoke call on {smoke['device']}, torch {smoke['torch']} ({smoke['started'][:16]})",
        )

    @classmethod
    def from_calls(cls, calls: dict[str, dict], stages: dict[str, dict]) -> Rate:
        """From the study's own calls (``provenance.json``'s ``calls``): a least-squares line
        through the finished stages' seconds against their operators counted on the CPU
        gives a stage's start-up and the seconds per operator (training and scoring
        alike), the rate raised where a stage stopped at the deadline would be estimated
        faster than it ran; a call's start is its longest time outside the study's stages
        (prepare, resolve, tokenize, features, the interpreter)."""
        points, stopped, starts = [], [], []
        for call in calls.values():
            ran = {n: s for n, s in call["finished"].items() if n in stages}
            points += [(stages[n]["ops"], s) for n, s in ran.items()]
            cut_short = [f for f in call["failed"] if f["reason"] == STOPPED_AT_DEADLINE]
            stopped += [(stages[f["stage"]]["ops"], f["seconds"]) for f in cut_short if f["stage"] in stages]
            starts.append(call["seconds"] - sum(ran.values()) - sum(f["seconds"] for f in call["failed"]))
        if len({ops for ops, _ in points}) < 2:
            raise ValueError(f"the study's calls finished {len(points)} stage(s): too few to fit a rate")
        ops, seconds = (np.array(v, dtype=float) for v in zip(*points))
        slope, start = np.polyfit(ops, seconds, 1)
        start = max(float(start), 0.0)
        per_op = max([float(slope), *((s - start) / o for o, s in stopped)])
        devices = sorted({call["device"] for call in calls.values()})
        return cls(
            per_op * 1e6,
            per_op * 1e6,
            start,
            max(starts),
            WORST,
            f"the study's {len(calls)} call(s) on {', '.join(devices)}: {len(points)} finished stages",
        )

    def stage_minutes(self, stage: dict) -> float:
        """The worst minutes of a stage of ``<scale>_study_ops.json``."""
        training = (stage["ops"] - stage["scoring_ops"]) * self.train_us_per_op
        scoring = stage["scoring_ops"] * self.scoring_us_per_op
        return self.worst * ((training + scoring) / 1e6 + self.stage_start_s) / 60

    @property
    def call_start_minutes(self) -> float:
        return self.worst * self.call_start_s / 60


@dataclass
class Call:
    stages: list[str] = field(default_factory=list)
    minutes: float = 0.0  # the worst case, the call's start included


@dataclass
class CallPlan:
    periods: list[list[Call]]
    too_long: dict[str, float]  # stages that alone exceed a call's deadline: their worst minutes
    rate: Rate
    deadline: float
    period: float = PERIOD_MINUTES  # device minutes a period may spend
    smoke_first: bool = True  # the first period opens with the smoke call


def priority_units(names: list[str]) -> list[list[str]]:
    """The stages in priority order, as what must share a call: MLM and the fine-tuning
    that starts from its model; every other stage on its own."""
    units = []
    for first in PRIORITY:
        group = [s for s in names if s == first or s.startswith(f"{first}@")]
        if first == "mlm":
            group = [s for s in names if s.startswith(("mlm@", "multitask-mlm@"))]
            units += [group] if group else []
        else:
            units += [[s] for s in group]
    listed = {s for unit in units for s in unit}
    return units + [[s] for s in names if s not in listed]  # a stage PRIORITY does not name: last


def cut(
    stages: dict[str, dict],
    rate: Rate,
    names: list[str] | None = None,
    deadline: float = DEADLINE_MINUTES,
    period: float = PERIOD_MINUTES,
    smoke_first: bool = True,
) -> CallPlan:
    """``names`` (default: every stage of ``stages``) cut into calls of at most ``deadline``
    worst minutes each, in priority order, and the calls into periods of at most
    ``period`` minutes, the first of which opens with the smoke call if ``smoke_first``."""
    spent = SMOKE_MINUTES if smoke_first else 0.0
    minutes = {s: rate.stage_minutes(stages[s]) for s in (names if names is not None else stages)}
    calls: list[Call] = []
    too_long = {}
    for unit in priority_units(list(minutes)):
        cost = sum(minutes[s] for s in unit)
        if rate.call_start_minutes + cost > deadline:
            too_long.update({s: minutes[s] for s in unit})
        elif calls and calls[-1].minutes + cost <= deadline:
            calls[-1].stages += unit
            calls[-1].minutes += cost
        else:
            calls.append(Call(list(unit), rate.call_start_minutes + cost))
    periods: list[list[Call]] = [[]]
    used = spent
    for call in calls:
        if used + call.minutes > period:
            periods.append([])
            used = 0.0
        periods[-1].append(call)
        used += call.minutes
    return CallPlan([p for p in periods if p], too_long, rate, deadline, period, smoke_first)


def node_command(call: Call, deadline: float = DEADLINE_MINUTES) -> str:
    """The node's command line of ``call`` (docs/gpu-node.md)."""
    return f"{NODE_RUN} --deadline {deadline:g} " + " ".join(f"--stage {s}" for s in call.stages)


NODE_RUN = 'PYTHONPATH=src python3 -m minbert offline-run offline-bundle --out "$OUT"'
SMOKE_COMMAND = f"{NODE_RUN} --deadline {SMOKE_MINUTES:g} --smoke"


def describe(plan: CallPlan) -> list[str]:
    """The plan as ``minbert gpu-plan`` prints it: the rate, then each period's calls with
    their worst minutes and node commands (the first period opens with the smoke call),
    then the stages no call can hold."""
    rate = plan.rate
    lines = [
        f"rate ({rate.source}): training {rate.train_us_per_op:.1f} us, scoring "
        f"{rate.scoring_us_per_op:.1f} us per operator counted on the CPU; a stage starts in "
        f"{rate.stage_start_s:.0f} s, a call in {rate.call_start_s:.0f} s; worst case x{rate.worst:g}"
    ]
    for p, calls in enumerate(plan.periods, 1):
        opening = SMOKE_MINUTES if p == 1 and plan.smoke_first else 0.0
        lines.append(
            f"period {p}: {opening + sum(c.minutes for c in calls):.1f} of {plan.period:g} device minutes"
        )
        if opening:
            lines.append(f"  {SMOKE_MINUTES:.1f} min: {SMOKE_COMMAND}")
        for call in calls:
            lines.append(f"  {call.minutes:.1f} min: {node_command(call, plan.deadline)}")
    for name, minutes in plan.too_long.items():
        lines.append(
            f"too long for one call: {name}, {minutes:.1f} worst minutes (a call has {plan.deadline:g})"
        )
    return lines
