"""The GPU results back on the DVC machine: calls unpacked into one folder mirroring the
repository (``metrics/gpu/`` by default) with ``provenance.json`` (the overrides, every
call, each stage's newest results and fingerprint, failures); ``status`` compares every
stage with the plan DVC resolves now: current, stale (what changed) or missing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from minbert.atomic import atomic_write_text
from minbert.gpu_study import PROVENANCE_FILE, read_provenance
from minbert.offline import parts
from minbert.offline.plan import fingerprint, resolve_plan, returned


def unpack(index_file: Path, into: Path) -> dict:
    """Add the call of ``index_file`` (its parts beside it) to the GPU results ``into``;
    returns what changed: ``added`` and ``kept`` (a newer call's) stages, ``failed``."""
    index, files = parts.read(index_file)
    into = Path(into)
    provenance = read_provenance(into)
    if provenance["overrides"] is None:
        provenance["overrides"] = index["overrides"]
    elif provenance["overrides"] != index["overrides"]:
        raise ValueError(
            f"{index_file}: made with --set {' '.join(index['overrides']) or '(none)'}, but {into} holds "
            f"the study made with --set {' '.join(provenance['overrides']) or '(none)'}: "
            "unpack it --into another folder"
        )
    call = index["started"]
    provenance["calls"][call] = {
        **{k: index[k] for k in ("commit", "uncommitted_changes", "device", "torch", "cuda", "python")},
        "checkpoint": index["checkpoint"],
        "seconds": index["seconds"],
        "lanes": index.get("lanes", 1),
        "threads": index.get("threads"),
        "finished": {s["stage"]: s["seconds"] for s in index["stages"]},
        "shared_with": {s["stage"]: s.get("shared_with", []) for s in index["stages"]},
        "peak_device_memory_bytes": {
            s["stage"]: s.get("peak_device_memory_bytes") for s in index["stages"] if s["files"]
        },
        "failed": [{k: v for k, v in f.items() if k != "traceback"} for f in index["failed"]],
        "not_run": index["not_run"],
    }
    if index.get("manifest") is not None:  # the data stage's, which the call's plan resolved from
        provenance["manifest"] = index["manifest"]

    def keep_log(entry: dict) -> str | None:
        """The stage's log of this call, in place of an older one's."""
        if entry.get("log") not in files:
            return None
        (into / entry["log"]).parent.mkdir(parents=True, exist_ok=True)
        (into / entry["log"]).write_bytes(files[entry["log"]])
        return entry["log"]

    changed = {"added": [], "kept": [], "failed": []}
    for stage in index["stages"]:
        name, known = stage["stage"], provenance["stages"].get(stage["stage"])
        if not stage["files"]:
            continue  # an upstream stage: its outputs stayed on the node
        if known is not None and known["call"] > call:
            changed["kept"].append(name)
            continue
        for old in set(known["files"] if known else ()) - set(stage["files"]):
            (into / old).unlink(missing_ok=True)
        for name_in_repo in stage["files"]:
            target = into / name_in_repo
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(files[name_in_repo])
        provenance["stages"][name] = {
            "call": call,
            "seconds": stage["seconds"],
            "files": stage["files"],
            "fingerprint": stage["fingerprint"],
            "log": keep_log(stage),
        }
        provenance["failures"].pop(name, None)
        changed["added"].append(name)
    for failed in index["failed"]:
        known = provenance["stages"].get(failed["stage"])
        if known is None or known["call"] < call:
            provenance["failures"][failed["stage"]] = {
                "call": call,
                "reason": failed["reason"],
                "log": keep_log(failed),
                "traceback": failed.get("traceback"),
            }
            changed["failed"].append(failed["stage"])
    provenance["calls"] = dict(sorted(provenance["calls"].items()))
    provenance["stages"] = dict(sorted(provenance["stages"].items()))
    atomic_write_text(into / PROVENANCE_FILE, json.dumps(provenance, indent=2) + "\n")
    return changed


@dataclass(frozen=True)
class StageStatus:
    stage: str
    state: str  # current | stale | missing
    reasons: tuple[str, ...]


def _differences(then: dict[str, str], now: dict[str, str]) -> list[str]:
    found = []
    for key in sorted(set(then) | set(now)):
        if key not in now:
            found.append(f"{key} is no longer a dependency")
        elif key not in then:
            found.append(f"{key} is a new dependency")
        elif then[key] != now[key]:
            found.append(f"{key} changed")
    return found


def status(into: Path, repo: Path = Path(".")) -> list[StageStatus]:
    """Every stage of the GPU results, and every stage of the plan with results to bring back."""
    provenance = read_provenance(into)
    if provenance["overrides"] is None:
        raise FileNotFoundError(
            f"{Path(into) / PROVENANCE_FILE}: no GPU results here (`minbert gpu-unpack` writes them)"
        )
    # The manifest the study's plan was resolved from: no data needed here.
    plan = resolve_plan(repo, provenance["overrides"], provenance.get("manifest"))
    planned = [s["name"] for s in plan["stages"] if returned(s)]
    found = []
    for name in planned + sorted(set(provenance["stages"]) - set(planned)):
        known = provenance["stages"].get(name)
        if known is None:
            failure = provenance["failures"].get(name)
            why = (
                f"failed in the call of {failure['call']}: {failure['reason']}" if failure else "not run yet"
            )
            found.append(StageStatus(name, "missing", (why,)))
        elif name not in planned:
            found.append(StageStatus(name, "stale", ("no longer a stage of dvc.yaml",)))
        else:
            reasons = _differences(known["fingerprint"], fingerprint(plan, name))
            found.append(StageStatus(name, "stale" if reasons else "current", tuple(reasons)))
    return found
