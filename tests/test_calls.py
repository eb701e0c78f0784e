"""The study's node calls re-cut from a measured rate (minbert.offline.calls): every call
within its deadline and every period within its device minutes, from the committed
operator counts of the gpu study and a made-up smoke call."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from minbert.offline.calls import (
    DEADLINE_MINUTES,
    PERIOD_MINUTES,
    SMOKE_COMMAND,
    SMOKE_MINUTES,
    Rate,
    cut,
    describe,
    priority_units,
)
from minbert.offline.smoke import SMOKE_STAGES

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


def test_a_plan_re_cut_at_20_us_per_operator_keeps_every_call_and_period_within_bounds():
    rate = Rate.measured(made_up_smoke(20.0), STAGES)
    assert rate.train_us_per_op == pytest.approx(20.0) and rate.scoring_us_per_op == pytest.approx(20.0)
    assert rate.stage_start_s == pytest.approx(20.0) and rate.call_start_s == 60.0
    plan = cut(STAGES, rate)
    assert not plan.too_long
    calls = [c for period in plan.periods for c in period]
    for call in calls:  # each call's worst case, its start-up included, within its deadline
        worst = rate.call_start_minutes + sum(rate.stage_minutes(STAGES[s]) for s in call.stages)
        assert call.minutes == pytest.approx(worst) and worst <= DEADLINE_MINUTES
    for p, period in enumerate(plan.periods):
        assert (SMOKE_MINUTES if p == 0 else 0) + sum(c.minutes for c in period) <= PERIOD_MINUTES
    ordered = [s for c in calls for s in c.stages]
    assert sorted(ordered) == sorted(STAGES)  # every stage once
    assert ordered == [s for unit in priority_units(list(STAGES)) for s in unit]  # priority order
    assert ordered[:3] == ["zero-shot", "sentiment@sst-last-layer", "sentiment@sst-full"]
    mlm = [c for c in calls if any(s.startswith("mlm@") for s in c.stages)]
    assert len(mlm) == 1 and "multitask-mlm@continue-baseline" in mlm[0].stages  # its model stays there
    printed = describe(plan)
    assert printed[2].endswith(SMOKE_COMMAND) and "period 1" in printed[1]


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
    plan = cut(STAGES, rate, period=11.0, smoke_first=False)
    assert all(sum(c.minutes for c in period) <= 11.0 for period in plan.periods)
    printed = describe(plan)
    assert not any(SMOKE_COMMAND in line for line in printed)
    assert printed[1].startswith("period 1:") and printed[1].endswith("of 11 device minutes")
    assert len(plan.periods) > len(cut(STAGES, rate).periods)


def made_up_calls(
    us_per_op: float, stage_start_s: float, finished: list[str], stopped: dict[str, float]
) -> dict:
    """A provenance's calls: each finished stage took ``stage_start_s`` plus its operators
    at ``us_per_op``; ``stopped``: stages cut short at the deadline after so many seconds;
    15 s outside the study's stages (prepare, resolve, tokenize, features)."""
    ran = {n: stage_start_s + STAGES[n]["ops"] * us_per_op * 1e-6 for n in finished}
    failed = [{"stage": n, "reason": "stopped at the --deadline", "seconds": s} for n, s in stopped.items()]
    failed.append({"stage": "multitask@concatenation", "reason": "exit status 1", "seconds": 1.0})
    outside = {"prepare": 1.0, "resolve": 0.5, "tokenize": 7.5, "features": 6.0}
    seconds = sum(ran.values()) + sum(f["seconds"] for f in failed) + sum(outside.values())
    return {
        "2026-11-26T23:01:34": {
            "device": "a made-up GPU",
            "seconds": seconds,
            "finished": {**outside, **ran},
            "failed": failed,
            "not_run": [],
        }
    }


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
