"""The study cut into node calls run in lanes (``minbert.offline.lanes``), each within its
``--deadline`` at the worst estimate, the calls into periods of device time. A stage's
estimate: its aten operators counted on the CPU (``bench/results/gpu_study_ops.json``) at
a rate (assumed, the smoke call's, or fitted to the study's calls), raised to its own
seconds in the study's calls where those are longer. docs/gpu-node.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from minbert.offline.lanes import ASSUMED_SHARING, STOPPED_AT_DEADLINE, Estimate, Lanes, simulate
from minbert.runs.gpu_calls import GpuCall

# A call's --deadline: a node command runs at most 10 minutes; one is left for the
# interpreter's start, the SIGTERM grace and packing what finished.
DEADLINE_MINUTES = 9.0
# Device minutes of a period a plan may spend (of 30: the machine's start for every call
# and the transfers are the rest).
PERIOD_MINUTES = 24.0
SMOKE_MINUTES = 6.0  # the smoke call's --deadline: the first call of the first period
WORST = 1.25  # the worst case over an estimate from a measured rate
NODE_CORES = 16  # the GPU node's (docs/gpu-node.md): at most this many lanes
LANES_TOLERANCE = 0.05  # more lanes only where they end the study at least this much sooner
STUDY_OPS = Path("bench/results/gpu_study_ops.json")  # the gpu study's operators per stage


@dataclass(frozen=True)
class Rate:
    """What a stage costs on the node: microseconds per operator counted on the CPU (of a
    training step, of a scoring batch), a stage's start-up, the stages every call reruns
    before its own (prepare, resolve, tokenize, features), a stage's slowdown while lanes
    share the GPU, and the stages whose own seconds in the study's calls say they take
    longer alone than their operators do: those seconds alone."""

    train_us_per_op: float
    scoring_us_per_op: float
    stage_start_s: float
    call_start_s: float
    worst: float  # the worst case's factor over the estimate
    source: str
    sharing: float = ASSUMED_SHARING
    sharing_source: str = "assumed"
    measured_s: dict[str, float] = field(default_factory=dict)

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
    def from_calls(cls, calls: dict[str, GpuCall], stages: dict[str, dict]) -> Rate:
        """From the study's own calls (``provenance.json``'s ``calls``): a least-squares line
        through the seconds of the stages that ran alone against their operators (raised
        where a stage stopped at the deadline ran slower); the sharing factor, the median
        of the shared stages' seconds over the line's (with no stage alone: the line is
        fitted to the shared ones, sharing x1); a call's start, its longest time outside
        the study's stages. A stage whose seconds in a call (at any commit), over the
        slowdown it ran under there, exceed the line's keeps those (``measured_s``): a
        count of host operators cannot see a stage bound by the device."""
        alone, shared, stopped, starts, lanes, ran_in = [], [], [], [], set(), []
        for key, call in calls.items():
            ran = {n: s for n, s in call.finished.items() if n in stages}
            sharing = call.shared_with
            for name, seconds in ran.items():
                (shared if sharing.get(name) else alone).append((stages[name]["ops"], seconds))
                ran_in.append((key, name, seconds, bool(sharing.get(name))))
            lanes.update([call.lanes] if any(sharing.get(n) for n in ran) else [])
            cut_short = [f for f in call.failed if f.reason == STOPPED_AT_DEADLINE]
            stopped += [
                (stages[f.stage]["ops"], f.seconds)
                for f in cut_short
                if f.stage in stages and not f.shared_with
            ]
            starts.append(call.seconds - sum(ran.values()) - sum(f.seconds or 0.0 for f in call.failed))
        points = alone if len({ops for ops, _ in alone}) >= 2 else shared
        if len({ops for ops, _ in points}) < 2:
            raise ValueError(
                f"the study's calls finished {len(alone) + len(shared)} stage(s): too few to fit a rate"
            )
        ops, seconds = (np.array(v, dtype=float) for v in zip(*points))
        slope, start = np.polyfit(ops, seconds, 1)
        start = max(float(start), 0.0)
        per_op = max([float(slope), *((s - start) / o for o, s in stopped)])
        if points is alone and shared:
            sharing = float(np.median([s / (start + o * per_op) for o, s in shared]))
            counts = ", ".join(map(str, sorted(lanes)))
            sharing_source = f"measured: {len(shared)} stages sharing the GPU in {counts} lanes"
        elif shared:
            sharing, sharing_source = 1.0, "in the rate: every stage measured shared the GPU"
        else:
            sharing, sharing_source = ASSUMED_SHARING, "assumed: no call has shared the GPU yet"
        devices = sorted({call.device for call in calls.values()})
        rate = cls(
            per_op * 1e6,
            per_op * 1e6,
            start,
            max(starts),
            WORST,
            f"the study's {len(calls)} call(s) on {', '.join(devices)}: {len(points)} finished stages",
            sharing,
            sharing_source,
        )

        # Each lane call's own slowdown (none where the line is fitted to shared stages:
        # the rate holds it), then each stage's longest seconds alone.
        def over_line(name: str, seconds: float) -> float:
            return seconds / (start + stages[name]["ops"] * per_op)

        lane_calls = {k for k, _, _, was in ran_in if was} if points is alone else set()
        slowdown = {
            k: float(np.median([over_line(n, s) for c, n, s, was in ran_in if c == k and was]))
            for k in lane_calls
        }
        alone_s: dict[str, float] = {}
        for key, name, seconds, was in ran_in:
            alone_s[name] = max(alone_s.get(name, 0.0), seconds / slowdown.get(key, 1.0) if was else seconds)
        longer = {n: s for n, s in alone_s.items() if round(s, 1) > rate.estimate(stages[n]).expected_s}
        return replace(rate, measured_s=longer)

    def estimate(self, stage: dict, name: str = "") -> Estimate:
        """A stage of ``<scale>_study_ops.json`` alone on the GPU: expected and worst seconds,
        its operators' at the rate or, where longer, stage ``name``'s own (``measured_s``)."""
        training = (stage["ops"] - stage["scoring_ops"]) * self.train_us_per_op
        scoring = stage["scoring_ops"] * self.scoring_us_per_op
        expected = max((training + scoring) / 1e6 + self.stage_start_s, self.measured_s.get(name, 0.0))
        return Estimate(round(expected, 1), round(self.worst * expected, 1))

    def stage_minutes(self, stage: dict, name: str = "") -> float:
        """The worst minutes of stage ``name`` alone on the GPU."""
        return self.estimate(stage, name).worst_s / 60

    @property
    def call_start_minutes(self) -> float:
        return self.worst * self.call_start_s / 60


def study_needs(names: list[str]) -> dict[str, list[str]]:
    """What each stage needs among ``names`` beyond the call's start: a fine-tuning from an
    MLM model (``multitask-mlm@<start>-<config>``) needs ``mlm@<start>``, whose model
    stays on the node, so the two share a call."""
    mlm = [n for n in names if n.startswith("mlm@")]
    return {
        n: [m for m in mlm if n.startswith(f"multitask-mlm@{m.split('@', 1)[1]}-")]
        for n in names
        if n.startswith("multitask-mlm@")
    }


@dataclass
class Call:
    stages: list[str] = field(default_factory=list)
    minutes: float = 0.0  # the worst case, the call's start included
    lanes: int = 1
    whole: bool = False  # every stage of the study: the node command names none
    left: dict[str, str] = field(default_factory=dict)  # stages left to a later call, and why


@dataclass
class CallPlan:
    periods: list[list[Call]]
    too_long: dict[str, float]  # stages that alone exceed a call's deadline: their worst minutes
    rate: Rate
    deadline: float
    period: float = PERIOD_MINUTES  # device minutes a period may spend
    smoke_first: bool = True  # the first period opens with the smoke call
    lanes: int = 1
    by_lanes: dict[int, float] = field(default_factory=dict)  # the whole study's worst minutes


def _estimates(stages: dict[str, dict], rate: Rate, names: list[str]) -> dict[str, Estimate]:
    return {n: rate.estimate(stages[n], n) for n in names}


def study_minutes(stages: dict[str, dict], rate: Rate, names: list[str], lanes: int) -> float:
    """Worst minutes of ``names`` in one call of ``lanes`` lanes with no deadline."""
    found = simulate(names, study_needs(names), _estimates(stages, rate, names), Lanes(lanes, rate.sharing))
    return (rate.worst * rate.call_start_s + found.seconds) / 60


def choose_lanes(stages: dict[str, dict], rate: Rate, names: list[str]) -> tuple[int, dict[int, float]]:
    """The fewest lanes (up to ``NODE_CORES``) whose study ends within ``LANES_TOLERANCE`` of
    the soonest, and the worst minutes at each number of lanes."""
    by_lanes = {k: study_minutes(stages, rate, names, k) for k in range(1, NODE_CORES + 1)}
    soonest = min(by_lanes.values())
    return min(k for k, m in by_lanes.items() if m <= (1 + LANES_TOLERANCE) * soonest), by_lanes


def cut(
    stages: dict[str, dict],
    rate: Rate,
    names: list[str] | None = None,
    deadline: float = DEADLINE_MINUTES,
    period: float = PERIOD_MINUTES,
    smoke_first: bool = True,
    lanes: int | None = None,
) -> CallPlan:
    """``names`` (default: every stage) in as few calls of ``lanes`` lanes (default:
    ``choose_lanes``) as hold them within ``deadline`` worst minutes: each call runs what the
    runner would start at the worst estimates, the rest (with the MLM stages they need) go
    to the next; the calls go into periods of ``period`` minutes (smoke call first)."""
    names = list(stages if names is None else names)
    by_lanes = {}
    if lanes is None:
        lanes, by_lanes = choose_lanes(stages, rate, names) if names else (1, {})
    needs, start_s = study_needs(names), rate.worst * rate.call_start_s
    # A stage's worst minutes alone in a call, after the stages it needs there.
    alone = {n: sum(rate.stage_minutes(stages[m], m) for m in (*needs.get(n, ()), n)) for n in names}
    too_long = {n: m for n, m in alone.items() if rate.call_start_minutes + m > deadline}
    left = [n for n in names if n not in too_long and not any(m in too_long for m in needs.get(n, ()))]
    calls: list[Call] = []
    while left:
        estimates = _estimates(stages, rate, left)
        for k in (lanes, 1):  # one lane where shared lanes would finish nothing for good
            found = simulate(left, needs, estimates, Lanes(k, rate.sharing), start_s, deadline * 60)
            later = set(found.not_started) | {m for n in found.not_started for m in needs.get(n, ())}
            if any(n not in later for n in found.ran):
                break
        else:
            raise ValueError(f"no call can finish {', '.join(left)} within {deadline:g} minutes")
        ran = [n for n in left if n in found.ran]
        calls.append(Call(ran, found.seconds / 60, k, ran == names, found.not_started))
        left = [n for n in left if n in later]
    periods: list[list[Call]] = [[]]
    used = SMOKE_MINUTES if smoke_first else 0.0
    for call in calls:
        if used + call.minutes > period:
            periods.append([])
            used = 0.0
        periods[-1].append(call)
        used += call.minutes
    return CallPlan([p for p in periods if p], too_long, rate, deadline, period, smoke_first, lanes, by_lanes)


def node_command(call: Call, deadline: float = DEADLINE_MINUTES) -> str:
    """The node's command line of ``call`` (docs/gpu-node.md)."""
    named = "" if call.whole else " " + " ".join(f"--stage {s}" for s in call.stages)
    return f"{NODE_RUN} --deadline {deadline:g} --lanes {call.lanes}{named}"


NODE_RUN = 'PYTHONPATH=src python3 -m minbert offline-run offline-bundle --out "$OUT"'
SMOKE_COMMAND = f"{NODE_RUN} --deadline {SMOKE_MINUTES:g} --smoke"


def describe(plan: CallPlan) -> list[str]:
    """The plan as ``minbert gpu-plan`` prints it: the rate and sharing, the lanes chosen,
    then each period's calls with their worst minutes and node commands (the first period
    opens with the smoke call), what each leaves to the next and why, then the stages no
    call can hold."""
    rate = plan.rate
    lines = [
        f"rate ({rate.source}): training {rate.train_us_per_op:.1f} us, scoring "
        f"{rate.scoring_us_per_op:.1f} us per operator counted on the CPU; a stage starts in "
        f"{rate.stage_start_s:.0f} s, a call in {rate.call_start_s:.0f} s; worst case x{rate.worst:g}; "
        f"sharing the GPU x{rate.sharing:.2f} ({rate.sharing_source}); "
        f"{len(rate.measured_s)} stage(s) estimated at their own measured seconds (above their operators')"
    ]
    if plan.by_lanes:
        tried = ", ".join(
            f"{k}: {m:.1f}" for k, m in plan.by_lanes.items() if k in (1, 2, 4, 8, 16, plan.lanes)
        )
        lines.append(
            f"lanes: {plan.lanes}, the fewest within {LANES_TOLERANCE:.0%} of the soonest end of the "
            f"whole study (worst minutes by lanes: {tried})"
        )
    for p, calls in enumerate(plan.periods, 1):
        opening = SMOKE_MINUTES if p == 1 and plan.smoke_first else 0.0
        lines.append(
            f"period {p}: {opening + sum(c.minutes for c in calls):.1f} of {plan.period:g} device minutes"
        )
        if opening:
            lines.append(f"  {SMOKE_MINUTES:.1f} min: {SMOKE_COMMAND}")
        for call in calls:
            held = "every stage" if call.whole else f"{len(call.stages)} stages"
            command = node_command(call, plan.deadline)
            lines.append(f"  {call.minutes:.1f} min, {held} in {call.lanes} lane(s): {command}")
            lines += [f"    left to the next call: {name}: {why}" for name, why in call.left.items()]
    for name, minutes in plan.too_long.items():
        lines.append(
            f"too long for one call: {name}, {minutes:.1f} worst minutes (a call has {plan.deadline:g})"
        )
    return lines


def read_ops(ops_file: Path = STUDY_OPS) -> tuple[str, dict[str, dict]]:
    """The scale and the stages' operators of ``<scale>_study_ops.json``."""
    results = json.loads(Path(ops_file).read_text(encoding="utf-8"))["results"]
    return results["scale"], results["stages"]


def study_rate(calls: dict[str, GpuCall], stages: dict[str, dict], smoke: dict | None = None) -> Rate:
    """The rate a plan uses: the smoke call's if given, else the study's calls', else assumed."""
    if smoke is not None:
        return Rate.measured(smoke, stages)
    return Rate.from_calls(calls, stages) if calls else Rate.assumed()


def bundle_call_plan(
    names: list[str], scale: str, calls: dict[str, GpuCall], ops_file: Path = STUDY_OPS
) -> dict:
    """What ``bundle.json`` tells the runner: the lanes the plan chooses, the sharing factor
    and every stage's estimate (none when the operators were counted at another scale)."""
    counted_scale, stages = read_ops(ops_file)
    if counted_scale != scale:
        return {
            "lanes": 1,
            "sharing": ASSUMED_SHARING,
            "estimates": {},
            "rate": f"none: operators counted at {counted_scale}",
        }
    rate = study_rate(calls, stages)
    known = [n for n in names if n in stages]
    lanes, _ = choose_lanes(stages, rate, known) if known else (1, {})
    return {
        "lanes": lanes,
        "sharing": rate.sharing,
        "rate": rate.source,
        "estimates": {n: vars(rate.estimate(stages[n], n)) for n in known},
    }
