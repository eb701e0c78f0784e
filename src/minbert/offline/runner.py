"""Run the pipeline's stages without DVC, from a bundle, and pack what they wrote.

The stages and their commands come from ``dvc.yaml`` itself (``minbert.offline.stages``)
and run in its order, each as DVC would run it: its ``cmd`` in the repository root,
with ``src/`` on ``PYTHONPATH`` (nothing needs installing). params.yaml is read with
the bundle's checkpoint and course files put in (``checkpoint``, ``data.source``) and
any ``--set`` overrides (``scale=gpu``), and restored afterwards. What the stages
wrote (their outs, metrics and plots, less model weights and tokenised tables) is
packed into at most ``MAX_FILES`` files of at most ``MAX_BYTES`` each, with a record
of where and how it ran: commit, device, torch version, each stage's seconds and the
sha256 of every source file it ran (``minbert.offline.results`` reads it back).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml

from minbert.offline.bundle import read_bundle
from minbert.offline.stages import Stage, read_stages, select
from minbert.results import is_record

MAX_FILES = 8  # parts and the index together
MAX_BYTES = 16 * 1024 * 1024
INDEX_FILE = "gpu-results.json"
INDEX_FORMAT = "minbert-offline-results/1"
# Outputs too large to carry back, and that the results do not need.
LEFT_BEHIND = ("models/", "data/tokenized", "data/settings")


def _set(params: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = params
    for part in parents:
        if not isinstance(node.get(part), dict):
            raise ValueError(f"--set {dotted}: params.yaml has no mapping {part!r}")
        node = node[part]
    if last not in node:
        raise ValueError(f"--set {dotted}: params.yaml has no key {last!r} there")
    node[last] = value


def effective_params(params: dict, overrides: dict[str, str]) -> dict:
    """``params`` with each ``key.path=value`` of ``overrides`` (values read as YAML)."""
    params = json.loads(json.dumps(params))  # a deep copy
    for key, value in overrides.items():
        _set(params, key, yaml.safe_load(value) if isinstance(value, str) else value)
    return params


def _command(stage: Stage) -> list[str]:
    """The stage's command, its leading ``python`` this interpreter."""
    args = shlex.split(stage.cmd)
    if args and args[0] in ("python", "python3"):
        args[0] = sys.executable
    return args


def file_hashes(repo: Path, names: set[str]) -> dict[str, str]:
    """The sha256 of each file named (relative to ``repo``), each file read once
    however many stages run it."""
    from minbert.data.download import sha256_file

    return {name: sha256_file(repo / name) for name in sorted(names) if (repo / name).is_file()}


def device_description() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or 'unknown'})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def run_offline(
    repo: Path, bundle: Path, out: Path, names: list[str], overrides: dict[str, str], log=print
) -> dict:
    """Run the stages ``names`` (all when empty) of ``repo`` from ``bundle``; pack their
    outputs into ``out``; returns the record written beside the parts."""
    repo, bundle = Path(repo).resolve(), Path(bundle).resolve()
    described = read_bundle(bundle)
    params_file = repo / "params.yaml"
    original = params_file.read_text(encoding="utf-8")
    applied = {"checkpoint": str(bundle / "checkpoint"), "data.source": str(bundle / "data"), **overrides}
    params = effective_params(yaml.safe_load(original), applied)
    stages = select(read_stages(repo / "dvc.yaml", params), names)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")]))
    ran = []
    try:
        params_file.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
        for stage in stages:
            log(f"stage {stage.name}: {stage.cmd}")
            started = time.perf_counter()
            done = subprocess.run(_command(stage), cwd=repo, env=env)
            seconds = time.perf_counter() - started
            if done.returncode != 0:
                raise ChildProcessError(f"stage {stage.name} failed (exit {done.returncode}): {stage.cmd}")
            ran.append({"stage": stage.name, "cmd": stage.cmd, "seconds": round(seconds, 1)})
    finally:
        params_file.write_text(original, encoding="utf-8")
    hashes = file_hashes(repo, {name for s in stages for name in s.source_files})
    record = {
        "format": INDEX_FORMAT,
        "commit": described["commit"],
        "bundle_uncommitted_changes": described["uncommitted_changes"],
        "checkpoint": described["checkpoint"],
        "overrides": dict(overrides),
        "params": params,
        **device_description(),
        "stages": [
            {**r, "sources": {name: hashes[name] for name in s.source_files}} for r, s in zip(ran, stages)
        ],
    }
    return pack(repo, stages, Path(out), record)


def _outputs(repo: Path, stages: list[Stage]) -> list[Path]:
    found = set()
    for stage in stages:
        for out in stage.outs:
            if out.startswith(LEFT_BEHIND):
                continue
            path = repo / out
            found |= {p for p in path.rglob("*") if p.is_file()} if path.is_dir() else {path}
    return sorted(p for p in found if p.is_file())


def pack(repo: Path, stages: list[Stage], out: Path, record: dict) -> dict:
    """The stages' outputs as one gzipped tar cut into parts, and the index that lists
    the parts with their sha256 and ``record``; every run's record (``minbert.results``)
    gets the checkpoint copy and commit it was produced with."""
    files = _outputs(repo, stages)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in files:
            name = path.relative_to(repo).as_posix()
            data = path.read_bytes()
            if name.startswith("metrics/") and is_record(name):
                content = json.loads(data)
                if isinstance(content, dict):
                    content["offline_run"] = {
                        "commit": record["commit"],
                        "checkpoint_copy": record["checkpoint"]["copy"],
                        "checkpoint_note": record["checkpoint"]["note"],
                        "device": record["device"],
                        "torch": record["torch"],
                    }
                    data = (json.dumps(content, indent=2) + "\n").encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    blob = buffer.getvalue()
    parts = [blob[i : i + MAX_BYTES] for i in range(0, len(blob), MAX_BYTES)] or [b""]
    if len(parts) > MAX_FILES - 1:
        raise ValueError(
            f"the results take {len(blob) / 2**20:.1f} MiB gzipped: more than {MAX_FILES - 1} parts of "
            f"{MAX_BYTES // 2**20} MiB; run fewer stages at a time"
        )
    out.mkdir(parents=True, exist_ok=True)
    index = {
        **record,
        "files": [p.relative_to(repo).as_posix() for p in files],
        "parts": [],
    }
    for i, part in enumerate(parts):
        name = f"gpu-results.part{i:02d}"
        (out / name).write_bytes(part)
        index["parts"].append({"file": name, "bytes": len(part), "sha256": hashlib.sha256(part).hexdigest()})
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return index
