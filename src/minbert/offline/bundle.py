"""The bundle: what an offline node needs to run the pipeline, made on the DVC machine.

A directory of

* ``code.tar``: the repository's tracked files at the current commit (``git archive``);
* ``data/``: the course CSV files the ``prepare`` stage reads (``data.source``);
* ``checkpoint/``: the checkpoint (``config.json``, ``vocab.txt``, the training-data
  list when there is one) with its weights as an fp16 copy, loaded into fp32 (half
  the size: all-MiniLM-L6-v2's 91 MB become 45 MB, under a 64 MiB transfer limit);
* ``bundle.json``: the commit, whether tracked files had uncommitted changes, the
  checkpoint's original weights file and sha256, and the sha256 of every file above.

On a node that has the repository's working tree already (a copy of it, as a GPU
lending service makes), the runner uses that tree and only ``data/`` and
``checkpoint/`` need to travel; elsewhere unpack ``code.tar`` first.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path

BUNDLE_FILE = "bundle.json"
BUNDLE_FORMAT = "minbert-offline-bundle/1"
CHECKPOINT_COPY = "fp16"  # how the bundle's weights differ from the checkpoint's


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout


def _files(directory: Path) -> dict[str, str]:
    from minbert.data.download import sha256_file

    return {
        p.relative_to(directory).as_posix(): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != BUNDLE_FILE
    }


def fp16_checkpoint(source: Path, dest: Path) -> dict:
    """Copy the checkpoint directory ``source`` to ``dest`` with its floating-point
    weights in fp16 (``model.safetensors``); what was copied, and from what."""
    import torch
    from safetensors.torch import save_file

    from minbert.data.download import sha256_file
    from minbert.model.checkpoint import HUB_WEIGHTS, TRAINING_DATA_FILE, read_state_dict

    weights = next((source / w for w in HUB_WEIGHTS if (source / w).is_file()), None)
    if weights is None:
        raise FileNotFoundError(f"{source}: no weights file ({' or '.join(HUB_WEIGHTS)})")
    dest.mkdir(parents=True)
    for name in ("config.json", "vocab.txt", TRAINING_DATA_FILE):
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
    state = {
        k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous()
        for k, v in read_state_dict(source).items()
    }
    save_file(state, str(dest / "model.safetensors"))
    return {
        "source": str(source),
        "source_weights": weights.name,
        "source_sha256": sha256_file(weights),
        "copy": CHECKPOINT_COPY,
        "note": "weights stored in fp16, loaded into fp32: not bit-identical to the checkpoint",
    }


def make_bundle(repo: Path, out: Path, data_dir: Path, checkpoint_dir: Path, checkpoint_name: str) -> dict:
    """Write the bundle to ``out`` (a new directory); returns ``bundle.json``'s content."""
    repo, out = Path(repo), Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: already exists; the bundle is written to a new directory")
    csvs = sorted(Path(data_dir).glob("*.csv"))
    if not csvs:
        raise FileNotFoundError(f"{data_dir}: no course CSV files")
    commit = _git(repo, "rev-parse", "HEAD").strip()
    changed = [line[3:] for line in _git(repo, "status", "--porcelain", "--untracked-files=no").splitlines()]
    out.mkdir(parents=True)
    with open(out / "code.tar", "wb") as f:
        subprocess.run(["git", "archive", "--format=tar", commit], cwd=repo, stdout=f, check=True)
    (out / "data").mkdir()
    for path in csvs + [p for p in [Path(data_dir) / "SHA256SUMS"] if p.is_file()]:
        shutil.copyfile(path, out / "data" / path.name)
    checkpoint = {"name": checkpoint_name, **fp16_checkpoint(Path(checkpoint_dir), out / "checkpoint")}
    described = {
        "format": BUNDLE_FORMAT,
        "commit": commit,
        # Tracked files that differed from the commit: the node runs the commit's code.
        "uncommitted_changes": changed,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": checkpoint,
        "files": _files(out),
    }
    (out / BUNDLE_FILE).write_text(json.dumps(described, indent=2) + "\n", encoding="utf-8")
    return described


def read_bundle(bundle: Path) -> dict:
    """``bundle.json`` of ``bundle``, every file checked against its recorded sha256."""
    from minbert.data.download import sha256_file

    bundle = Path(bundle)
    path = bundle / BUNDLE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{bundle}: not a bundle (no {BUNDLE_FILE}; `minbert bundle` writes one)")
    described = json.loads(path.read_text(encoding="utf-8"))
    if described.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path}: format {described.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    for name, digest in described["files"].items():
        if name == "code.tar" and not (bundle / name).is_file():
            continue  # left behind where the node has the working tree already
        if not (bundle / name).is_file():
            raise FileNotFoundError(f"{bundle / name}: listed in {BUNDLE_FILE} but missing")
        if name != "code.tar" and sha256_file(bundle / name) != digest:
            raise ValueError(f"{bundle / name}: sha256 differs from {BUNDLE_FILE}'s (damaged in transfer?)")
    return described
