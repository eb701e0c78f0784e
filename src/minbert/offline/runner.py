"""A bundle's plan run on a node without DVC (``src/`` on ``PYTHONPATH``), after checking
every source file against the plan's sha256. After every stage the outputs finished so
far are packed into ``out``, so a failed or stopped call brings back what it finished; a
failed stage's dependants are skipped. No node path leaves the node."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from minbert.offline import parts
from minbert.offline.bundle import read_bundle
from minbert.offline.node import require_node_packages
from minbert.offline.plan import by_name, fingerprint, returned, select
from minbert.results import is_record

STOPPED_AT_DEADLINE = "stopped at the --deadline"  # a failure's reason (a stage cut short)

STOP_GRACE_S = 30  # after SIGTERM at the deadline, before SIGKILL


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


def _run_stage(repo: Path, cmd: str, env: dict, seconds_left: float | None) -> str | None:
    """Run one stage; None when it succeeded, else why not."""
    process = subprocess.Popen(_command(cmd), cwd=repo, env=env, start_new_session=True)
    try:
        code = process.wait(timeout=seconds_left)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return STOPPED_AT_DEADLINE
    return None if code == 0 else f"exit status {code}"


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


def _portable(name: str, data: bytes, call: dict, node_checkpoint: str, checkpoint: str) -> bytes:
    """A returned file as it leaves the node: a record names the checkpoint as params.yaml
    does and says how the run was made."""
    if not is_record(name):
        return data
    record = _renamed(json.loads(data), node_checkpoint, checkpoint)
    record["offline_run"] = {
        "commit": call["commit"],
        "checkpoint_copy": call["checkpoint"]["copy"],
        "checkpoint_note": call["checkpoint"]["note"],
        "device": call["device"],
        "torch": call["torch"],
    }
    return (json.dumps(record, indent=2) + "\n").encode()


def _pack(repo: Path, out: Path, plan: dict, call: dict, node_checkpoint: str) -> dict:
    """Everything ``call`` finished so far, packed into ``out``."""
    stages = by_name(plan)
    files = {}
    for done in call["stages"]:
        done["files"] = []
        for path in _outputs(repo, stages[done["stage"]]):
            name = path.relative_to(repo).as_posix()
            files[name] = _portable(
                name, path.read_bytes(), call, node_checkpoint, plan["params"]["checkpoint"]
            )
            done["files"].append(name)
    return parts.write(out, files, call)


def run_call(
    repo: Path,
    bundle: Path,
    out: Path,
    names: list[str],
    deadline_minutes: float | None = None,
    log=print,
    params_edit=None,
) -> dict:
    """Run the stages ``names`` (and the stages they need; none named: all) of the plan
    in ``bundle``, packing into ``out`` after each; returns the index written last.
    ``params_edit(params)``: a change to the plan's params.yaml (the smoke call's slice)."""
    started = time.monotonic()
    require_node_packages()  # before the first stage: a node without one stops here
    repo, bundle = Path(repo).resolve(), Path(bundle).resolve()
    described = read_bundle(bundle)
    plan = described["plan"]
    stages = by_name(plan)
    order = select(plan, names)
    _check_sources(repo, [stages[n] for n in order])
    # The bundle by its path from the repository root: no node path in the settings.
    where = bundle.relative_to(repo).as_posix() if repo in bundle.parents else str(bundle)
    params = json.loads(json.dumps(plan["params"]))
    params["checkpoint"] = f"{where}/checkpoint"
    params["data"]["source"] = f"{where}/data"
    if params_edit is not None:
        params_edit(params)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")]))
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
        "stages": [],  # finished, each with its seconds, files and fingerprint
        "failed": [],
        "not_run": [],
    }
    params_file = repo / "params.yaml"
    original = params_file.read_bytes()
    try:
        params_file.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
        finished = set()
        for name in order:
            stage = stages[name]
            blocked = [n for n in stage["needs"] if n not in finished]
            seconds_left = (
                None if deadline_minutes is None else deadline_minutes * 60 - (time.monotonic() - started)
            )
            if blocked:
                call["not_run"].append({"stage": name, "reason": f"needs {blocked[0]}, which did not finish"})
                continue
            if seconds_left is not None and seconds_left <= 0:
                call["not_run"].append({"stage": name, "reason": "the --deadline was reached"})
                continue
            log(f"stage {name}: {stage['cmd']}")
            began = time.monotonic()
            failure = _run_stage(repo, stage["cmd"], env, seconds_left)
            seconds = round(time.monotonic() - began, 1)
            if failure is None:
                finished.add(name)
                call["stages"].append(
                    {"stage": name, "seconds": seconds, "fingerprint": fingerprint(plan, name)}
                )
            else:
                log(f"stage {name} failed after {seconds} s: {failure}")
                call["failed"].append({"stage": name, "reason": failure, "seconds": seconds})
            call["seconds"] = round(time.monotonic() - started, 1)
            _pack(repo, Path(out), plan, call, params["checkpoint"])
    finally:
        params_file.write_bytes(original)
    call["seconds"] = round(time.monotonic() - started, 1)
    return _pack(repo, Path(out), plan, call, params["checkpoint"])
