"""The bundle an offline node needs besides the repository's files: ``data/`` (the course
CSV files), ``checkpoint/`` (its weights as an fp16 copy) and ``bundle.json`` (commit,
changed files, checkpoint, plan, the call plan's lanes and estimates, every file's
sha256). ``call_size`` is what a call sends."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

from minbert.commits import git

BUNDLE_FILE = "bundle.json"
BUNDLE_FORMAT = "minbert-offline-bundle/3"
CHECKPOINT_COPY = "fp16"  # how the bundle's weights differ from the checkpoint's
SEND_LIMIT = 64 * 2**20  # what one call may send to the node: the repository's files and the bundle


def _files(directory: Path) -> dict[str, str]:
    from minbert.data.download import sha256_file

    return {
        p.relative_to(directory).as_posix(): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != BUNDLE_FILE
    }


def sent_files(repo: Path) -> list[Path]:
    """The repository's files a call sends: the tracked ones and the untracked ones git
    does not ignore, as they are in the working tree."""
    listed = git(Path(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return [
        Path(repo) / name for name in sorted(set(listed.split("\0")) - {""}) if (Path(repo) / name).is_file()
    ]


def call_size(repo: Path, bundle: Path) -> dict[str, int]:
    """Bytes one call sends: the repository's files and the bundle (once if it is among them)."""
    bundle = Path(bundle).resolve()
    tree = [p for p in sent_files(repo) if bundle not in p.resolve().parents]
    sizes = {
        "tree": sum(p.stat().st_size for p in tree),
        "bundle": sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()),
    }
    return {**sizes, "total": sizes["tree"] + sizes["bundle"]}


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
        "source_weights": weights.name,
        "source_sha256": sha256_file(weights),
        "copy": CHECKPOINT_COPY,
        "note": "weights stored in fp16, loaded into fp32: not bit-identical to the checkpoint",
    }


def make_bundle(
    repo: Path, out: Path, data_dir: Path, checkpoint_dir: Path, plan: dict, call_plan: dict
) -> dict:
    """Write the bundle of ``plan`` to ``out`` (a new directory), with ``call_plan``
    (``minbert.offline.calls.bundle_call_plan``); returns ``bundle.json``'s content."""
    repo, out = Path(repo), Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: already exists; the bundle is written to a new directory")
    csvs = sorted(Path(data_dir).glob("*.csv"))
    if not csvs:
        raise FileNotFoundError(f"{data_dir}: no course CSV files")
    changed = [line[3:] for line in git(repo, "status", "--porcelain").splitlines()]
    out.mkdir(parents=True)
    (out / "data").mkdir()
    for path in csvs + [p for p in [Path(data_dir) / "SHA256SUMS"] if p.is_file()]:
        shutil.copyfile(path, out / "data" / path.name)
    checkpoint = {
        "name": plan["params"]["checkpoint"],
        **fp16_checkpoint(Path(checkpoint_dir), out / "checkpoint"),
    }
    described = {
        "format": BUNDLE_FORMAT,
        "commit": git(repo, "rev-parse", "HEAD").strip(),
        # The node runs the working tree as sent, these files as they were here.
        "uncommitted_changes": changed,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": checkpoint,
        "plan": plan,
        "call_plan": call_plan,
        "files": _files(out),
    }
    (out / BUNDLE_FILE).write_text(json.dumps(described, indent=2) + "\n", encoding="utf-8")
    return described


def bundle_study(repo: Path, out: Path, overrides: list[str], data_dir: Path | None) -> str:
    """``minbert bundle``: DVC's plan for params.yaml with ``overrides``, packed into ``out``
    with the course files and the checkpoint; refused (and removed) when one call would
    send the node more than SEND_LIMIT. Returns the line to print."""
    from minbert.data.prepare import resolve_source
    from minbert.gpu_study import GPU_RESULTS_DIR
    from minbert.model.checkpoint import resolve_checkpoint
    from minbert.offline.calls import STUDY_OPS, bundle_call_plan
    from minbert.offline.plan import resolve_plan, returned
    from minbert.runs.gpu_calls import read_gpu_provenance

    plan = resolve_plan(repo, overrides)
    data_dir = data_dir or resolve_source(plan["params"]["data"]["source"])
    if data_dir is None:
        raise FileNotFoundError("no local course files to bundle: give --data DIR")
    results = [s["name"] for s in plan["stages"] if returned(s)]
    calls = read_gpu_provenance(Path(repo) / GPU_RESULTS_DIR).calls
    call_plan = bundle_call_plan(results, plan["params"]["scale"], calls, Path(repo) / STUDY_OPS)
    checkpoint = resolve_checkpoint(plan["params"]["checkpoint"])
    described = make_bundle(repo, out, data_dir, checkpoint, plan, call_plan)
    size = call_size(repo, out)
    sends = (
        f"a call sends {size['total'] / 2**20:.1f} MiB: the repository's files "
        f"{size['tree'] / 2**20:.1f} MiB, the bundle {size['bundle'] / 2**20:.1f} MiB"
    )
    if size["total"] > SEND_LIMIT:
        shutil.rmtree(out)
        raise ValueError(f"{sends}, more than the node takes ({SEND_LIMIT // 2**20} MiB); bundle removed")
    return (
        f"{out}: {len(plan['stages'])} stages at scale {plan['params']['scale']}, "
        f"commit {described['commit'][:12]} and {len(described['uncommitted_changes'])} changed files; "
        f"{call_plan['lanes']} lanes by default ({len(call_plan['estimates'])} stages estimated); " + sends
    )


def read_bundle(bundle: Path) -> dict:
    """``bundle.json`` of ``bundle``, every file checked against its recorded sha256."""
    from minbert.data.download import sha256_file

    bundle = Path(bundle)
    path = bundle / BUNDLE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{bundle}: not a bundle (no {BUNDLE_FILE}; `minbert bundle` writes one)")
    described = json.loads(path.read_text(encoding="utf-8"))
    if described.get("format") != BUNDLE_FORMAT:
        raise ValueError(
            f"{path}: format {described.get('format')!r}, expected {BUNDLE_FORMAT!r} "
            "(run `minbert bundle` again)"
        )
    for name, digest in described["files"].items():
        if not (bundle / name).is_file():
            raise FileNotFoundError(f"{bundle / name}: listed in {BUNDLE_FILE} but missing")
        if sha256_file(bundle / name) != digest:
            raise ValueError(f"{bundle / name}: sha256 differs from {BUNDLE_FILE}'s (damaged in transfer?)")
    return described
