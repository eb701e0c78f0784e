"""The lanes' policy (minbert.offline.lanes), as the runner and the plan both apply it: the
order stages start in, when one is refused for time, and a call simulated at the worst
estimates; and the cores shared among processes side by side (minbert.cores)."""

from __future__ import annotations

import pytest

from minbert.cores import THREAD_VARIABLES, side_by_side, threads_each
from minbert.offline.lanes import DEADLINE_REACHED, Estimate, Lanes, refusal, simulate, start_order

ESTIMATES = {"long": Estimate(100.0, 125.0), "short": Estimate(10.0, 12.5), "mid": Estimate(50.0, 62.5)}


def test_stages_start_after_the_calls_own_start_the_longest_first():
    ready = ["short", "prepare", "long", "mid", "tokenize"]
    assert start_order(ready, ESTIMATES) == ["prepare", "tokenize", "long", "mid", "short"]


def test_a_stage_is_refused_when_its_worst_estimate_shared_exceeds_the_time_left():
    alone, shared = Lanes(1), Lanes(4, sharing=2.0)
    assert refusal("long", ESTIMATES, alone, None) is None  # no deadline
    assert refusal("long", ESTIMATES, alone, 125.0) is None
    assert refusal("long", ESTIMATES, alone, 124.0).startswith("not started: its worst estimate, 125 s,")
    why = refusal("long", ESTIMATES, shared, 200.0)
    assert why == "not started: its worst estimate in 4 lanes (x2), 250 s, exceeds the 200 s left"
    assert refusal("prepare", ESTIMATES, shared, 1.0) is None  # not estimated: the call's start
    assert refusal("prepare", ESTIMATES, shared, 0.0) == DEADLINE_REACHED


def test_a_simulated_call_packs_the_lanes_and_leaves_what_cannot_finish():
    names = ["short", "long", "mid", "tail"]
    estimates = {**ESTIMATES, "tail": Estimate(10.0, 10.0)}
    # Two lanes, x1.5: long 187.5 s and mid 93.75 s start at 5; short then tail follow mid.
    found = simulate(names, {}, estimates, Lanes(2, 1.5), start_s=5.0)
    assert found.ran["long"] == (5.0, 192.5) and found.ran["mid"] == (5.0, 98.75)
    assert found.ran["short"][0] == 98.75 and found.ran["tail"][0] == pytest.approx(117.5)
    assert found.seconds == 192.5 and not found.not_started
    # With 150 s: `long` cannot finish in time, so it never starts; the rest do, in time.
    cut = simulate(names, {}, estimates, Lanes(2, 1.5), start_s=5.0, deadline_s=150.0)
    assert list(cut.not_started) == ["long"] and cut.not_started["long"].startswith("not started")
    assert set(cut.ran) == {"short", "mid", "tail"} and cut.seconds <= 150.0


def test_a_stage_whose_need_was_not_started_is_not_started_either():
    estimates = {"mlm": Estimate(100.0, 100.0), "tuned": Estimate(100.0, 100.0)}
    found = simulate(["mlm", "tuned"], {"tuned": ["mlm"]}, estimates, Lanes(1), deadline_s=150.0)
    assert set(found.ran) == {"mlm"}  # `tuned` would end at 200 s
    assert found.not_started["tuned"].startswith("not started")
    first = simulate(["mlm", "tuned"], {"tuned": ["mlm"]}, estimates, Lanes(1), deadline_s=50.0)
    assert first.not_started == {
        "mlm": first.not_started["mlm"],
        "tuned": "needs mlm, which was not started",
    }


def test_processes_side_by_side_share_the_cores():
    assert threads_each(2, cores=2) == 1 and threads_each(3, cores=2) == 1
    assert threads_each(8, cores=16) == 2 and threads_each(1, cores=16) == 16
    env = side_by_side(4, {"PATH": "/bin", "OMP_NUM_THREADS": "16"})
    assert env["PATH"] == "/bin" and {env[v] for v in THREAD_VARIABLES} == {str(threads_each(4))}
