"""The study's node calls re-cut from a measured rate (minbert.offline.calls): every call
within its deadline and every period within its device minutes, from the committed
operator counts of the gpu study and a made-up smoke call."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from minbert.offline.calls import (
    DEADLINE_MINUTES,
    LANES_TOLERANCE,
    SMOKE_COMMAND,
    Rate,
    cut,
    describe,
    study_needs,
)
from minbert.offline.lanes import ASSUMED_SHARING
from minbert.offline.smoke import SMOKE_STAGES
from minbert.runs.gpu_calls import CheckpointCopy, GpuCall, Unfinished

STAGES = json.loads((REPO / "bench" / "results" / "gpu_study_ops.json").read_text())["results"]["stages"]


def made_up_smoke(us_per_op: float, stage_start_s: float = 20.0, call_start_s: float = 60.0) -> dict:
    """A smoke call's smoke.json whose steps and scoring batches take ``us_per_op`` per
    operator counted on the CPU."""
    stages = {}
    for name, kind in SMOKE_STAGES.items():
        step = us_per_op * 1e-6 * STAGES[name]["ops_per_step"]
        scoring = us_per_op * 1e-6 * STAGES[name]["sst_scoring_batch_ops"]
        stages[name] = {
            "kind": kind,
            "seconds": stage_start_s + 24 * step,
            "steps": 24,
            "losses_finite": True,
            "smart_control": 0.0,
            "measured": {
                "step": {"seconds": step, "ops": 1.0, "us_per_op": 1.0},
                "sst_scoring_batch": {"seconds": scoring, "ops": 1.0, "us_per_op": 1.0},
                "losses_finite": True,
                "smart_control": 0.0,
            },
        }
    return {
        "device": "a made-up GPU",
        "torch": "2.11",
        "started": "2026-11-25T00:00:00",
        "call_start_seconds": call_start_s,
        "stages": stages,
        "problems": [],
        "passed": True,
    }


def _every_call(plan) -> list:
    return [c for period in plan.periods for c in period]


def test_a_plan_re_cut_at_20_us_per_operator_holds_the_whole_study_in_one_call_of_lanes():
    rate = Rate.measured(made_up_smoke(20.0), STAGES)
    assert rate.train_us_per_op == pytest.approx(20.0) and rate.scoring_us_per_op == pytest.approx(20.0)
    assert rate.stage_start_s == pytest.approx(20.0) and rate.call_start_s == 60.0
    assert rate.sharing == ASSUMED_SHARING
    plan = cut(STAGES, rate)
    assert not plan.too_long
    (call,) = _every_call(plan)
    assert call.whole and sorted(call.stages) == sorted(STAGES) and call.lanes == plan.lanes > 1
    # Its worst case: the call's start, then the longest lane, every stage slowed by sharing.
    longest = max(rate.stage_minutes(STAGES[s]) for s in STAGES) * rate.sharing
    assert longest + rate.call_start_minutes <= call.minutes <= DEADLINE_MINUTES
    assert call.minutes == pytest.approx(plan.by_lanes[plan.lanes])
    # The fewest lanes within the tolerance of the soonest; fewer end later than that.
    soonest = min(plan.by_lanes.values())
    assert plan.by_lanes[plan.lanes] <= (1 + LANES_TOLERANCE) * soonest
    assert all(plan.by_lanes[k] > (1 + LANES_TOLERANCE) * soonest for k in range(1, plan.lanes))
    printed = describe(plan)
    assert printed[3].endswith(SMOKE_COMMAND) and "period 1" in printed[2]
    assert printed[4].endswith(f"--deadline 9 --lanes {plan.lanes}")  # no --stage: every stage


def test_a_study_that_does_not_fit_one_call_says_which_stages_go_to_the_next_and_why():
    rate = Rate(30.0, 30.0, 13.0, 25.0, 1.25, "made up: 30 us per operator")
    plan = cut(STAGES, rate, smoke_first=False)
    calls = _every_call(plan)
    assert len(calls) > 1 and not calls[0].whole and not plan.too_long
    ran = [s for call in calls for s in call.stages]
    assert sorted(ran) == sorted(STAGES)  # every stage once
    for call in calls:
        assert call.minutes <= DEADLINE_MINUTES
    # The first call leaves each of the PCGrad + SMART stages to a later one: sharing the
    # GPU, its worst estimate exceeds what is left of the deadline.
    assert "multitask@best" in calls[0].left and "multitask@best" not in calls[0].stages
    assert calls[0].left["multitask@best"].startswith("not started: its worst estimate in")
    mlm = [c for c in calls if "mlm@continue" in c.stages]
    assert len(mlm) == 1 and "multitask-mlm@continue-baseline" in mlm[0].stages  # its model stays there
    printed = describe(plan)
    assert any(line.startswith("    left to the next call: multitask@best: not started") for line in printed)
    assert any("--stage multitask@best" in line for line in printed)


def test_mlm_fine_tuning_left_to_a_later_call_takes_its_mlm_stage_along():
    rate = Rate(20.0, 20.0, 13.0, 25.0, 1.25, "made up")
    names = ["mlm@continue", "multitask-mlm@continue-baseline"]
    assert study_needs([*names, "zero-shot"]) == {"multitask-mlm@continue-baseline": ["mlm@continue"]}
    minutes = [rate.stage_minutes(STAGES[n]) for n in names]
    # A deadline that holds both in one lane: a call's worth, both in it.
    plan = cut(STAGES, rate, names, deadline=sum(minutes) + rate.call_start_minutes, smoke_first=False)
    assert [c.stages for c in _every_call(plan)] == [names] and not plan.too_long
    # A deadline that holds each alone but not one after the other: the fine-tuning is too
    # long for any call (its MLM model never leaves the node), MLM's own results come back.
    each = max(minutes) + rate.call_start_minutes + 0.01
    plan = cut(STAGES, rate, names, deadline=each, smoke_first=False, lanes=1)
    assert [c.stages for c in _every_call(plan)] == [["mlm@continue"]]
    assert plan.too_long == {names[1]: pytest.approx(sum(minutes))}


def test_a_stage_too_long_for_any_call_is_named_not_planned():
    plan = cut(STAGES, Rate.measured(made_up_smoke(70.0), STAGES))
    assert "multitask@best" in plan.too_long and plan.too_long["multitask@best"] > DEADLINE_MINUTES
    assert not any("multitask@best" in c.stages for p in plan.periods for c in p)
    assert any(line.startswith("too long for one call: multitask@best,") for line in describe(plan))


def test_only_a_passed_smoke_call_gives_a_rate():
    failed = {
        **made_up_smoke(20.0),
        "passed": False,
        "problems": ["multitask@best: a training loss is not finite"],
    }
    with pytest.raises(ValueError, match="did not pass: multitask@best: a training loss is not finite"):
        Rate.measured(failed, STAGES)


def test_a_later_period_plan_fits_a_shorter_period_without_the_smoke_call():
    # Once the study has a call, the plan opens with no smoke call; a session lent fewer
    # device minutes cuts its periods to them.
    rate = Rate.measured(made_up_smoke(20.0), STAGES)
    plan = cut(STAGES, rate, period=11.0, smoke_first=False, lanes=1)
    assert all(sum(c.minutes for c in period) <= 11.0 for period in plan.periods)
    printed = describe(plan)
    assert not any(SMOKE_COMMAND in line for line in printed)
    assert printed[1].startswith("period 1:") and printed[1].endswith("of 11 device minutes")
    assert len(plan.periods) > len(cut(STAGES, rate, lanes=1).periods)


def made_up_calls(
    us_per_op: float,
    stage_start_s: float,
    finished: list[str],
    stopped: dict[str, float],
    shared: dict[str, float] | None = None,
) -> dict:
    """A provenance's calls: each finished stage took ``stage_start_s`` plus its operators
    at ``us_per_op``; ``stopped``: stages cut short at the deadline after so many seconds;
    15 s outside the study's stages (prepare, resolve, tokenize, features)."""
    ran = {n: stage_start_s + STAGES[n]["ops"] * us_per_op * 1e-6 for n in finished}
    failed = [{"stage": n, "reason": "stopped at the --deadline", "seconds": s} for n, s in stopped.items()]
    failed.append({"stage": "multitask@concatenation", "reason": "exit status 1", "seconds": 1.0})
    outside = {"prepare": 1.0, "resolve": 0.5, "tokenize": 7.5, "features": 6.0}
    seconds = sum(ran.values()) + sum(f["seconds"] for f in failed) + sum(outside.values())
    calls = {"2026-11-26T23:01:34": _call(seconds=seconds, finished={**outside, **ran}, failed=failed)}
    if shared:  # a lane call: these stages side by side, each slowed by its factor
        slowed = {n: f * (stage_start_s + STAGES[n]["ops"] * us_per_op * 1e-6) for n, f in shared.items()}
        calls["2026-11-27T10:00:00"] = _call(
            seconds=15.0 + max(slowed.values()),
            lanes=len(shared),
            finished={**outside, **slowed},
            shared_with={n: sorted(set(shared) - {n}) for n in shared},
        )
    return calls


def _call(failed: list[dict] = (), **fields) -> GpuCall:
    """A call as provenance.json records it, on a made-up GPU."""
    checkpoint = CheckpointCopy("all-minilm-l6-v2", "model.safetensors", "0" * 64, "fp16", "a copy")
    where = {"commit": "0" * 40, "uncommitted_changes": [], "device": "a made-up GPU", "torch": "2.11"}
    return GpuCall(
        **where, cuda="13.0", python="3.12", checkpoint=checkpoint, failed=[Unfinished(**f) for f in failed],
        not_run=[], **fields,
    )  # fmt: skip


FINISHED = ["zero-shot", "sentiment@sst-full", "sentiment@cfimdb-full", "multitask@baseline"]


def test_the_study_calls_give_the_rate_and_start_up_they_ran_at():
    rate = Rate.from_calls(made_up_calls(20.0, 12.0, FINISHED, {}), STAGES)
    assert rate.train_us_per_op == pytest.approx(20.0) and rate.scoring_us_per_op == pytest.approx(20.0)
    assert rate.stage_start_s == pytest.approx(12.0) and rate.call_start_s == pytest.approx(15.0)
    assert rate.worst > 1 and "1 call(s) on a made-up GPU: 4 finished stages" in rate.source
    # A stage cut short at the deadline after longer than the line gives for its whole
    # run raises the rate to what it had at least (a crash's seconds say nothing).
    slow = STAGES["multitask@best"]["ops"] * 50e-6 + 12.0
    raised = Rate.from_calls(made_up_calls(20.0, 12.0, FINISHED, {"multitask@best": slow}), STAGES)
    assert raised.train_us_per_op == pytest.approx(50.0)
    assert rate.stage_minutes(STAGES["multitask@best"]) < raised.stage_minutes(STAGES["multitask@best"])


def test_one_finished_stage_is_too_few_for_a_rate():
    with pytest.raises(ValueError, match="finished 1 stage"):
        Rate.from_calls(made_up_calls(20.0, 12.0, ["multitask@baseline"], {}), STAGES)


def test_a_lane_call_measures_the_slowdown_of_sharing_the_gpu():
    shared = {"multitask@best": 1.8, "multitask@best-adamw": 2.0, "multitask@concatenation": 2.2}
    rate = Rate.from_calls(made_up_calls(20.0, 12.0, FINISHED, {}, shared), STAGES)
    # The line through the stages that ran alone; the median of the shared stages' factors.
    assert rate.train_us_per_op == pytest.approx(20.0) and rate.stage_start_s == pytest.approx(12.0)
    assert rate.sharing == pytest.approx(2.0) and rate.sharing_source.startswith("measured: 3 stages")
    alone = cut(STAGES, Rate.from_calls(made_up_calls(20.0, 12.0, FINISHED, {}), STAGES))
    slower = cut(STAGES, rate)
    # In one lane, only the stage slowed beyond the factor (2.2) is slower: by its own seconds.
    concatenation = "multitask@concatenation"
    assert list(rate.measured_s) == [concatenation]
    own = rate.stage_minutes(STAGES[concatenation], concatenation) - rate.stage_minutes(STAGES[concatenation])
    assert slower.by_lanes[4] > alone.by_lanes[4]
    assert slower.by_lanes[1] == pytest.approx(alone.by_lanes[1] + own)


def test_a_stage_slower_than_its_operators_say_is_planned_at_its_own_measured_seconds():
    # As best-round-robin-equal on the H200 (2026-11-27): bound by the device, not the host,
    # it took 3 times its operators' estimate in lanes where the others took about 1.5.
    slow = "multitask@best-round-robin-equal"
    shared = {
        "multitask@best": 1.4,
        "multitask@best-adamw": 1.5,
        "multitask@best-summed": 1.5,
        "multitask@concatenation": 1.6,
        slow: 3.0,
    }
    calls = made_up_calls(20.0, 12.0, FINISHED, {}, shared)
    rate = Rate.from_calls(calls, STAGES)
    assert rate.sharing == pytest.approx(1.5) and set(rate.measured_s) == {slow, "multitask@concatenation"}
    measured = calls["2026-11-27T10:00:00"].finished[slow]
    operators, own = rate.estimate(STAGES[slow]), rate.estimate(STAGES[slow], slow)
    assert measured == pytest.approx(3.0 * operators.expected_s, abs=0.2)
    assert own.expected_s == pytest.approx(measured / rate.sharing, abs=0.05)
    assert own.worst_s == pytest.approx(rate.worst * measured / rate.sharing, abs=0.05)
    assert "2 stage(s) estimated at their own measured seconds" in describe(cut(STAGES, rate))[0]
    # Beside multitask@baseline in 2 lanes, the call lasts its own worst seconds, shared.
    pair = [slow, "multitask@baseline"]
    (call,) = _every_call(cut(STAGES, rate, pair, smoke_first=False, lanes=2))
    assert call.minutes == pytest.approx(rate.call_start_minutes + own.worst_s * rate.sharing / 60)
    # A deadline its operators' worst estimate fits, its own does not: too long for a call.
    deadline = rate.call_start_minutes + (operators.worst_s + own.worst_s) / 2 / 60
    plan = cut(STAGES, rate, pair, deadline=deadline, smoke_first=False, lanes=1)
    assert plan.too_long == {slow: pytest.approx(own.worst_s / 60)}
    assert [c.stages for c in _every_call(plan)] == [["multitask@baseline"]]
