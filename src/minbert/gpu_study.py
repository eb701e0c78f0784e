"""Where the `gpu` scale's study lies on the DVC machine: ``minbert gpu-unpack`` gathers
each GPU node call under ``GPU_RESULTS_DIR`` as its own metrics/ and predictions/, with
``provenance.json`` (every call, each stage's newest results, the failures;
``minbert.offline.gpu_results`` writes it, the report reads it); which of those results
ran with code that has changed since (``changed_code``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from minbert.runs.gpu_calls import GpuProvenance

GPU_RESULTS_DIR = Path("metrics/gpu")  # where `minbert gpu-unpack` gathers a study by default


# A stage's code, among the files its fingerprint names (minbert.offline.plan): the rest
# are its settings files, params values and command, which `minbert gpu-status` resolves.
CODE = ("src/", "stages/")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def changed_code(provenance: GpuProvenance, repo: Path) -> dict[str, list[str]]:
    """Each stage with GPU results: the code files (``CODE``) it ran with that differ in
    ``repo`` now, or are gone."""
    now: dict[str, str] = {}
    found = {}
    for stage, known in provenance.stages.items():
        code = {n: d for n, d in known.fingerprint.items() if n.startswith(CODE)}
        for name in code.keys() - now.keys():
            now[name] = _sha256(Path(repo) / name)
        found[stage] = sorted(n for n, d in code.items() if now[n] != d)
    return found


def named_files(files: list[str], at_most: int = 3) -> str:
    """``files`` by their names (with their folder where two share a name), the first
    ``at_most`` of them and how many more."""
    names = [Path(f).name for f in files]
    shown = ", ".join(
        f"`{Path(f).parent.name}/{n}`" if names.count(n) > 1 else f"`{n}`"
        for f, n in zip(files[:at_most], names)
    )
    return shown + (f" and {len(files) - at_most} more" if len(files) > at_most else "")
