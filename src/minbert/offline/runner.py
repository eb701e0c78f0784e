"""A bundle's plan run on a node without DVC (``src/`` on ``PYTHONPATH``), its source files
checked against the plan's sha256; stages side by side in lanes (``minbert.offline.lanes``),
each with its log; after each stage, what finished and every log are packed into ``out``.
No node path leaves the node."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from minbert.cores import side_by_side, threads_each
from minbert.offline import parts
from minbert.offline.bundle import read_bundle
from minbert.offline.lanes import (
    ASSUMED_SHARING,
    STOPPED_AT_DEADLINE,
    Estimate,
    Lanes,
    refusal,
    start_order,
)
from minbert.offline.node import require_node_packages
from minbert.offline.plan import by_name, fingerprint, returned, select
from minbert.results import is_record

STOP_GRACE_S = 30  # after SIGTERM at the deadline, before SIGKILL
POLL_S = 0.2  # how often the runner looks at its lanes
LOG_BYTES = 256 * 2**10  # the end of a stage's log that comes back
LOGS = "logs"  # where the logs lie among the returned files


def device_description() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or 'unknown'})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "python": platform.python_version(),
    }


def _check_sources(repo: Path, stages: list[dict]) -> None:
    """Refuse to run code other than the plan's."""
    from minbert.data.download import sha256_file

    wanted = {name: digest for s in stages for name, digest in s["sources"].items()}
    differ = [
        n for n, d in wanted.items() if (sha256_file(repo / n) if (repo / n).is_file() else "missing") != d
    ]
    if differ:
        raise ValueError(
            f"{len(differ)} source file(s) differ from the plan's ({', '.join(differ[:3])}"
            f"{', ...' if len(differ) > 3 else ''}): the bundle was made from other code; "
            "run `minbert bundle` again and send that"
        )


def _command(cmd: str) -> list[str]:
    args = shlex.split(cmd)
    if args and args[0] in ("python", "python3"):
        args[0] = sys.executable
    return args


def _renamed(value, node_name: str, name: str):
    """``value`` (a JSON document) with ``node_name`` replaced by ``name`` in every string."""
    if isinstance(value, str):
        return value.replace(node_name, name)
    if isinstance(value, list):
        return [_renamed(v, node_name, name) for v in value]
    if isinstance(value, dict):
        return {k: _renamed(v, node_name, name) for k, v in value.items()}
    return value


def _outputs(repo: Path, stage: dict) -> list[Path]:
    found = []
    for out in returned(stage):
        path = repo / out
        found += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [p for p in found if p.is_file()]


def log_name(stage: str) -> str:
    return f"{LOGS}/{stage}.log"


def last_traceback(log: str, lines: int = 40) -> str:
    """The last traceback in ``log`` (else its last lines), at most ``lines`` long."""
    found = log.rsplit("Traceback (most recent call last):", 1)
    text = ("Traceback (most recent call last):" + found[1]) if len(found) == 2 else log
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class _Lane:
    """A stage running in a lane: its process, log and what it shared the GPU with."""

    name: str
    process: subprocess.Popen
    began: float
    log: Path
    measures: Path
    shared_with: set[str] = field(default_factory=set)

    def ran(self, seconds: float, threads: int, lanes: int) -> dict:
        """How it ran, for the call's index and the stage's records."""
        measured = json.loads(self.measures.read_text()) if self.measures.is_file() else {}
        return {
            "seconds": seconds,
            "lanes": lanes,
            "shared_with": sorted(self.shared_with),
            "threads": measured.get("torch_threads", threads),
            "peak_device_memory_bytes": measured.get("peak_device_memory_bytes"),
        }


def _stop(lanes: dict[str, _Lane]) -> None:
    """SIGTERM every lane's process group, then SIGKILL what is left after the grace."""
    for lane in lanes.values():
        os.killpg(lane.process.pid, signal.SIGTERM)
    until = time.monotonic() + STOP_GRACE_S
    for lane in lanes.values():
        try:
            lane.process.wait(timeout=max(until - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            os.killpg(lane.process.pid, signal.SIGKILL)
            lane.process.wait()


def _portable(name: str, data: bytes, call: dict, ran: dict, node_checkpoint: str, checkpoint: str) -> bytes:
    """A returned file as it leaves the node: a record names the checkpoint as params.yaml
    does and says how the run was made (``ran``: its stage's seconds, lanes, memory)."""
    if not is_record(name):
        return data
    record = _renamed(json.loads(data), node_checkpoint, checkpoint)
    record["offline_run"] = {
        "commit": call["commit"],
        "checkpoint_copy": call["checkpoint"]["copy"],
        "checkpoint_note": call["checkpoint"]["note"],
        "device": call["device"],
        "torch": call["torch"],
        "ran": ran,
    }
    return (json.dumps(record, indent=2) + "\n").encode()


def _pack(repo: Path, out: Path, plan: dict, call: dict, logs: Path, node_checkpoint: str, scrub) -> dict:
    """Everything ``call`` finished so far, and every log (``scrub``bed), packed into ``out``."""
    stages, checkpoint = by_name(plan), plan["params"]["checkpoint"]
    files = {}
    for done in call["stages"]:
        done["files"] = []
        ran = {k: done[k] for k in ("seconds", "lanes", "shared_with", "threads", "peak_device_memory_bytes")}
        for path in _outputs(repo, stages[done["stage"]]):
            name = path.relative_to(repo).as_posix()
            files[name] = _portable(name, path.read_bytes(), call, ran, node_checkpoint, checkpoint)
            done["files"].append(name)
    for entry in call["stages"] + call["failed"]:
        log = logs / f"{entry['stage']}.log"
        if log.is_file():  # its end
            files[entry["log"]] = scrub(log.read_bytes()[-LOG_BYTES:].decode(errors="replace")).encode()
    return parts.write(out, files, call)


def run_call(
    repo: Path,
    bundle: Path,
    out: Path,
    names: list[str],
    deadline_minutes: float | None = None,
    log=print,
    params_edit=None,
    lanes: int | None = None,
    estimated: bool = True,
) -> dict:
    """Run the stages ``names`` (and the stages they need; none named: all) of the plan
    in ``bundle`` in ``lanes`` lanes (default: the bundle's call plan's), packing into
    ``out`` after each; returns the index written last. ``params_edit(params)``: a change
    to the plan's params.yaml (the smoke call's slice, whose stages are not the ones
    estimated: ``estimated=False``)."""
    started = time.monotonic()
    require_node_packages()  # before the first stage: a node without one stops here
    from minbert.pipeline.stage import MEASURES_ENV

    repo, bundle = Path(repo).resolve(), Path(bundle).resolve()
    described = read_bundle(bundle)
    plan, call_plan = described["plan"], described["call_plan"]
    stages = by_name(plan)
    order = select(plan, names)
    _check_sources(repo, [stages[n] for n in order])
    estimates = {n: Estimate(**e) for n, e in call_plan["estimates"].items()} if estimated else {}
    lanes_ = Lanes(lanes or call_plan["lanes"], call_plan.get("sharing", ASSUMED_SHARING))
    threads = threads_each(lanes_.count)
    # The bundle by its path from the repository root: no node path in the settings.
    where = bundle.relative_to(repo).as_posix() if repo in bundle.parents else str(bundle)
    params = json.loads(json.dumps(plan["params"]))
    params["checkpoint"] = f"{where}/checkpoint"
    params["data"]["source"] = f"{where}/data"
    if params_edit is not None:
        params_edit(params)
    # Every stage's own threads, and a traceback for any error (not the one line a
    # person at a terminal gets): the log is all that comes back.
    env = side_by_side(lanes_.count, dict(os.environ, MINBERT_DEBUG="1", COLUMNS="160"))
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])
    call = {
        "commit": described["commit"],
        "uncommitted_changes": described["uncommitted_changes"],
        "checkpoint": described["checkpoint"],
        "overrides": plan["overrides"],
        # When the call started, on the node's clock: names the call, and the newest
        # call's result of a stage wins when calls are unpacked.
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
        **device_description(),
        "requested": list(names),
        "deadline_minutes": deadline_minutes,
        "lanes": lanes_.count,
        "threads": threads,
        "sharing_assumed": lanes_.sharing,
        "manifest": plan.get("manifest"),  # the data stage's, which the plan was resolved from
        "stages": [],  # finished, each with its seconds, files, fingerprint, log and lanes
        "failed": [],
        "not_run": [],
    }
    params_file = repo / "params.yaml"
    original = params_file.read_bytes()
    scratch = tempfile.TemporaryDirectory(prefix="minbert-logs.")  # the stages' logs, packed after each
    logs = Path(scratch.name)

    def scrub(text: str) -> str:
        """``text`` naming no node path: the repository, the bundle's checkpoint and data."""
        text = text.replace(f"{repo}/", "").replace(str(repo), ".")
        return text.replace(params["checkpoint"], plan["params"]["checkpoint"]).replace(where, "<bundle>")

    def pack() -> dict:
        call["seconds"] = round(time.monotonic() - started, 1)
        return _pack(repo, Path(out), plan, call, logs, params["checkpoint"], scrub)

    def finish(lane: _Lane, failure: str | None) -> None:
        seconds = round(time.monotonic() - lane.began, 1)
        ran = lane.ran(seconds, threads, lanes_.count)
        if failure is None:
            finished.add(lane.name)
            entry = {"stage": lane.name, **ran, "fingerprint": fingerprint(plan, lane.name)}
            call["stages"].append({**entry, "log": log_name(lane.name)})
            log(f"stage {lane.name} finished in {seconds} s")
        else:
            log_text = scrub(lane.log.read_text(errors="replace")) if lane.log.is_file() else ""
            tail = last_traceback(log_text)
            call["failed"].append(
                {"stage": lane.name, "reason": failure, **ran, "log": log_name(lane.name), "traceback": tail}
            )
            log(f"stage {lane.name} failed after {seconds} s: {failure}\n{tail}")
        pack()

    finished: set[str] = set()
    pending, running = list(order), {}
    try:
        params_file.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
        while pending or running:
            left = None if deadline_minutes is None else deadline_minutes * 60 - (time.monotonic() - started)
            if left is not None and left <= 0 and running:
                _stop(running)
                for lane in running.values():
                    finish(lane, STOPPED_AT_DEADLINE)
                running = {}
            unfinished = {s["stage"] for s in call["failed"] + call["not_run"]}
            for name in list(pending):  # in the plan's order: a stage after those it needs
                blocked = [n for n in stages[name]["needs"] if n in unfinished]
                if blocked:
                    call["not_run"].append(
                        {"stage": name, "reason": f"needs {blocked[0]}, which did not finish"}
                    )
                    unfinished.add(name)
                    pending.remove(name)
            ready = [n for n in pending if all(m in finished for m in stages[n]["needs"])]
            for name in start_order(ready, estimates):
                if len(running) >= lanes_.count:
                    break
                pending.remove(name)
                why = refusal(name, estimates, lanes_, left)
                if why:
                    call["not_run"].append({"stage": name, "reason": why})
                    log(f"stage {name}: {why}")
                    continue
                log(f"stage {name}: {stages[name]['cmd']}")
                output, measures, began = logs / f"{name}.log", logs / f"{name}.json", time.monotonic()
                with open(output, "wb") as sink:
                    process = subprocess.Popen(
                        _command(stages[name]["cmd"]),
                        cwd=repo,
                        env={**env, MEASURES_ENV: str(measures)},
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                lane = _Lane(name, process, began, output, measures)
                for other in running.values():
                    other.shared_with.add(name)
                    lane.shared_with.add(other.name)
                running[name] = lane
            if not running:
                if pending and not ready:  # cannot happen with the plan's needs
                    raise RuntimeError(f"stages that can never start: {', '.join(pending)}")
                continue
            time.sleep(POLL_S)
            for name, lane in list(running.items()):
                code = lane.process.poll()
                if code is not None:
                    del running[name]
                    finish(lane, None if code == 0 else f"exit status {code}")
    finally:
        if running:
            _stop(running)
        params_file.write_bytes(original)
    try:
        return pack()
    finally:
        scratch.cleanup()
