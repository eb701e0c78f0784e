"""What a node call brings back: one gzipped tar cut into parts of at most ``MAX_BYTES`` and
an index (``gpu-results.json``), rewritten after every stage; parts are named by content
and the index renamed into place last, so a killed call leaves a whole previous set."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

MAX_FILES = 8  # files a call may bring back
MAX_BYTES = 16 * 2**20  # bytes per file
MAX_PARTS = (MAX_FILES - 2) // 2  # old and new parts side by side, the index and its temporary copy
INDEX_FILE = "gpu-results.json"
INDEX_FORMAT = "minbert-offline-results/2"
PART_PREFIX = "gpu-results-"


def write(out: Path, files: dict[str, bytes], index: dict) -> dict:
    """Pack ``files`` (repository path -> content) into ``out`` with ``index``; returns
    the index written, its ``parts`` filled in."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(files[name]), 0
            tar.addfile(info, io.BytesIO(files[name]))
    blob = buffer.getvalue()
    chunks = [blob[i : i + MAX_BYTES] for i in range(0, len(blob), MAX_BYTES)]
    if len(chunks) > MAX_PARTS:
        raise ValueError(
            f"the results take {len(blob) / 2**20:.1f} MiB gzipped: more than {MAX_PARTS} parts of "
            f"{MAX_BYTES // 2**20} MiB; run fewer stages in a call"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(blob).hexdigest()
    parts = []
    for i, chunk in enumerate(chunks):
        name = f"{PART_PREFIX}{digest[:16]}.part{i}"
        (out / f".{name}").write_bytes(chunk)
        os.replace(out / f".{name}", out / name)
        parts.append({"file": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    index = {**index, "format": INDEX_FORMAT, "parts": parts}
    (out / f".{INDEX_FILE}").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    os.replace(out / f".{INDEX_FILE}", out / INDEX_FILE)
    for old in out.glob(f"{PART_PREFIX}*.part*"):
        if old.name not in {p["file"] for p in parts}:
            old.unlink()
    return index


def read(index_file: Path) -> tuple[dict, dict[str, bytes]]:
    """The index and the files of a call's results, every part checked against its sha256."""
    index_file = Path(index_file)
    index = json.loads(index_file.read_text(encoding="utf-8"))
    if index.get("format") != INDEX_FORMAT:
        raise ValueError(f"{index_file}: format {index.get('format')!r}, expected {INDEX_FORMAT!r}")
    blob = b""
    for part in index["parts"]:
        path = index_file.parent / part["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: a part listed in {index_file.name} is missing")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != part["sha256"]:
            raise ValueError(f"{path}: sha256 differs from {index_file.name}'s (damaged in transfer?)")
        blob += data
    files = {}
    if blob:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if not member.isfile() or Path(member.name).is_absolute() or ".." in parts:
                    raise ValueError(
                        f"{index_file}: refusing {member.name!r} (not a plain file inside the results)"
                    )
                files[member.name] = tar.extractfile(member).read()
    return index, files
