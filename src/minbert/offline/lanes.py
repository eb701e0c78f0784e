"""How a node call runs its stages side by side, for the runner and the plan alike: up to
K lanes, each ready stage a process, the longest expected first; a stage whose worst
estimate (slowed by sharing the GPU) exceeds the time left is not started."""

from __future__ import annotations

from dataclasses import dataclass, field

# A failure's reason for a stage cut short, and a not-run's for one never started.
STOPPED_AT_DEADLINE = "stopped at the --deadline"
DEADLINE_REACHED = "the --deadline was reached"
# A stage's slowdown while lanes share one GPU, until a lane call measures it.
ASSUMED_SHARING = 1.5


@dataclass(frozen=True)
class Estimate:
    """A stage's seconds on the node, alone on the GPU: expected and at worst."""

    expected_s: float
    worst_s: float


@dataclass(frozen=True)
class Lanes:
    count: int
    sharing: float = ASSUMED_SHARING  # a stage's slowdown when count > 1

    def worst(self, estimate: Estimate) -> float:
        return estimate.worst_s * (self.sharing if self.count > 1 else 1.0)


def start_order(ready: list[str], estimates: dict[str, Estimate]) -> list[str]:
    """``ready`` in the order to start them: stages without an estimate first (the call's
    own start: prepare, resolve, tokenize, features), then the longest expected first."""
    return sorted(ready, key=lambda s: (s in estimates, -estimates[s].expected_s if s in estimates else 0.0))


def refusal(
    name: str, estimates: dict[str, Estimate], lanes: Lanes, seconds_left: float | None
) -> str | None:
    """Why ``name`` may not start with ``seconds_left`` before the deadline; None: it may."""
    if seconds_left is None:
        return None
    if seconds_left <= 0:
        return DEADLINE_REACHED
    if name in estimates and (worst := lanes.worst(estimates[name])) > seconds_left:
        shared = f" in {lanes.count} lanes (x{lanes.sharing:g})" if lanes.count > 1 else ""
        return (
            f"not started: its worst estimate{shared}, {worst:.0f} s, exceeds the {seconds_left:.0f} s left"
        )
    return None


@dataclass
class Simulated:
    """Each started stage's (start, end) seconds in the call, and those not started, why."""

    ran: dict[str, tuple[float, float]] = field(default_factory=dict)
    not_started: dict[str, str] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return max((end for _, end in self.ran.values()), default=0.0)


def simulate(
    names: list[str],
    needs: dict[str, list[str]],
    estimates: dict[str, Estimate],
    lanes: Lanes,
    start_s: float = 0.0,
    deadline_s: float | None = None,
) -> Simulated:
    """``names`` run as the runner would if every stage took its worst estimate, after
    ``start_s`` (the call's own start); a need outside ``names`` counts as met."""
    found, now, running, pending = Simulated(), start_s, {}, list(names)
    done: set[str] = set()
    while pending or running:
        for name in list(pending):
            missed = [n for n in needs.get(name, ()) if n in found.not_started]
            if missed:
                found.not_started[name] = f"needs {missed[0]}, which was not started"
                pending.remove(name)
        ready = [n for n in pending if all(m in done or m not in names for m in needs.get(n, ()))]
        for name in start_order(ready, estimates):
            if len(running) >= lanes.count:
                break
            why = refusal(name, estimates, lanes, None if deadline_s is None else deadline_s - now)
            pending.remove(name)
            if why:
                found.not_started[name] = why
                continue
            end = now + (lanes.worst(estimates[name]) if name in estimates else 0.0)
            running[name] = end
            found.ran[name] = (now, end)
        if not running:
            if pending and not ready:
                raise ValueError(f"stages whose needs never run: {', '.join(pending)}")
            continue
        now = min(running.values())
        for name in [n for n, end in running.items() if end <= now]:
            done.add(name)
            del running[name]
    return found
