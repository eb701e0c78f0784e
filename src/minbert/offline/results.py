"""Results of an offline run, back on the DVC machine: unpacked, recorded, checked for staleness.

``unpack`` checks each part against the sha256 its index records, joins them and
extracts the files under the GPU results folder (``metrics/gpu/`` by default:
``metrics/gpu/metrics/multitask/best.json``, ``metrics/gpu/report/README.md``, ...),
with ``provenance.json`` beside them: commit, device, torch version, each stage's
seconds and the sha256 of every source file it ran. ``status`` compares those hashes
and the parameters with the working tree, as ``dvc status`` does for the CPU
results: a stage is stale when a source file it ran has changed since, or when
params.yaml (with the run's overrides put back in) no longer gives what it ran with.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from minbert.offline.runner import INDEX_FORMAT, effective_params, file_hashes

PROVENANCE_FILE = "provenance.json"


def unpack(index_file: Path, into: Path) -> dict:
    """Unpack the parts listed by ``index_file`` (beside it) into ``into``; returns the
    provenance written there."""
    index_file = Path(index_file)
    index = json.loads(index_file.read_text(encoding="utf-8"))
    if index.get("format") != INDEX_FORMAT:
        raise ValueError(f"{index_file}: format {index.get('format')!r}, expected {INDEX_FORMAT!r}")
    parts = []
    for part in index["parts"]:
        path = index_file.parent / part["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: a part listed in {index_file.name} is missing")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != part["sha256"]:
            raise ValueError(f"{path}: sha256 differs from {index_file.name}'s (damaged in transfer?)")
        parts.append(data)
    into = Path(into)
    with tarfile.open(fileobj=io.BytesIO(b"".join(parts)), mode="r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            target = (into / member.name).resolve()
            if not member.isfile() or into.resolve() not in target.parents:
                raise ValueError(
                    f"{index_file}: refusing {member.name!r} (not a plain file inside the results)"
                )
        into.mkdir(parents=True, exist_ok=True)
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links and odd modes too
            tar.extractall(into, members=members, filter="data")
        else:
            tar.extractall(into, members=members)
    provenance = {k: v for k, v in index.items() if k not in ("parts", "format")}
    (into / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    return provenance


@dataclass(frozen=True)
class StageStatus:
    stage: str
    current: bool
    reasons: tuple[str, ...]


def _comparable(params: dict) -> dict:
    """``params`` less what the runner pointed at the bundle (the checkpoint's path,
    the course files' directory), which the bundle's own record covers."""
    params = json.loads(json.dumps(params))
    params.pop("checkpoint", None)
    params.get("data", {}).pop("source", None)
    return params


def status(into: Path, repo: Path = Path(".")) -> list[StageStatus]:
    """Each stage of the committed GPU results: current, or stale and why."""
    path = Path(into) / PROVENANCE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no GPU results here (`minbert gpu-unpack` writes them)")
    provenance = json.loads(path.read_text(encoding="utf-8"))
    now = yaml.safe_load((Path(repo) / "params.yaml").read_text(encoding="utf-8"))
    params_changed = _comparable(effective_params(now, provenance["overrides"])) != _comparable(
        provenance["params"]
    )
    checkpoint_changed = now.get("checkpoint") != provenance["checkpoint"]["name"]
    now_hashes = file_hashes(Path(repo), {name for s in provenance["stages"] for name in s["sources"]})
    found = []
    for stage in provenance["stages"]:
        reasons = []
        for name, digest in stage["sources"].items():
            if name not in now_hashes:
                reasons.append(f"{name} is gone")
            elif now_hashes[name] != digest:
                reasons.append(f"{name} changed")
        if params_changed:
            reasons.append("params.yaml changed")
        if checkpoint_changed:
            reasons.append(
                f"checkpoint is now {now.get('checkpoint')!r}, not {provenance['checkpoint']['name']!r}"
            )
        found.append(StageStatus(stage["stage"], not reasons, tuple(reasons)))
    return found
