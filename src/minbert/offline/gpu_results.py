"""The GPU results back on the DVC machine: calls unpacked into one folder mirroring the
repository (``metrics/gpu/`` by default) with ``provenance.json`` (the overrides, every
call, each stage's newest results and fingerprint, failures); ``status`` compares every
stage with the plan DVC resolves now: current, stale (what changed) or missing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minbert.offline import parts
from minbert.offline.plan import fingerprint, resolve_plan, returned
from minbert.runs.gpu_calls import (
    PROVENANCE_FILE,
    GpuCall,
    GpuFailure,
    GpuProvenance,
    GpuStageResult,
    read_gpu_provenance,
    write_gpu_provenance,
)


def unpack(index_file: Path, into: Path) -> dict:
    """Add the call of ``index_file`` (its parts beside it) to the GPU results ``into``;
    returns what changed: ``added`` and ``kept`` (a newer call's) stages, ``failed``."""
    index, files = parts.read(index_file)
    into = Path(into)
    provenance = read_gpu_provenance(into)
    if provenance.overrides is not None and provenance.overrides != index["overrides"]:
        raise ValueError(
            f"{index_file}: made with --set {' '.join(index['overrides']) or '(none)'}, but {into} holds "
            f"the study made with --set {' '.join(provenance.overrides) or '(none)'}: "
            "unpack it --into another folder"
        )
    call = index["started"]
    calls = dict(provenance.calls)
    calls[call] = GpuCall.from_dict(
        {
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
    )

    def keep_log(entry: dict) -> str | None:
        """The stage's log of this call, in place of an older one's."""
        if entry.get("log") not in files:
            return None
        (into / entry["log"]).parent.mkdir(parents=True, exist_ok=True)
        (into / entry["log"]).write_bytes(files[entry["log"]])
        return entry["log"]

    stages, failures = dict(provenance.stages), dict(provenance.failures)
    changed = {"added": [], "kept": [], "failed": []}
    for stage in index["stages"]:
        name, known = stage["stage"], stages.get(stage["stage"])
        if not stage["files"]:
            continue  # an upstream stage: its outputs stayed on the node
        if known is not None and known.call > call:
            changed["kept"].append(name)
            continue
        for old in set(known.files if known else ()) - set(stage["files"]):
            (into / old).unlink(missing_ok=True)
        for name_in_repo in stage["files"]:
            target = into / name_in_repo
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(files[name_in_repo])
        stages[name] = GpuStageResult(
            call, stage["seconds"], stage["files"], stage["fingerprint"], keep_log(stage)
        )
        failures.pop(name, None)
        changed["added"].append(name)
    for failed in index["failed"]:
        known = stages.get(failed["stage"])
        if known is None or known.call < call:
            failures[failed["stage"]] = GpuFailure(
                call, failed["reason"], keep_log(failed), failed.get("traceback")
            )
            changed["failed"].append(failed["stage"])
    # The data stage's manifest, which the call's plan was resolved from.
    manifest = index["manifest"] if index.get("manifest") is not None else provenance.manifest
    overrides = index["overrides"] if provenance.overrides is None else provenance.overrides
    updated = GpuProvenance(provenance.format, overrides, calls, stages, failures, manifest)
    write_gpu_provenance(into, updated)
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
    provenance = read_gpu_provenance(into)
    if provenance.overrides is None:
        raise FileNotFoundError(
            f"{Path(into) / PROVENANCE_FILE}: no GPU results here (`minbert gpu-unpack` writes them)"
        )
    # The manifest the study's plan was resolved from: no data needed here.
    plan = resolve_plan(repo, provenance.overrides, provenance.manifest)
    planned = [s["name"] for s in plan["stages"] if returned(s)]
    found = []
    for name in planned + sorted(set(provenance.stages) - set(planned)):
        known = provenance.stages.get(name)
        if known is None:
            failure = provenance.failures.get(name)
            why = f"failed in the call of {failure.call}: {failure.reason}" if failure else "not run yet"
            found.append(StageStatus(name, "missing", (why,)))
        elif name not in planned:
            found.append(StageStatus(name, "stale", ("no longer a stage of dvc.yaml",)))
        else:
            reasons = _differences(known.fingerprint, fingerprint(plan, name))
            found.append(StageStatus(name, "stale" if reasons else "current", tuple(reasons)))
    return found
