"""Where the `gpu` scale's study lies on the DVC machine: ``minbert gpu-unpack`` gathers
each GPU node call under ``GPU_RESULTS_DIR`` as its own metrics/ and predictions/, with
``provenance.json`` (every call, each stage's newest results, the failures;
``minbert.offline.gpu_results`` writes it, the report reads it)."""

from __future__ import annotations

import json
from pathlib import Path

GPU_RESULTS_DIR = Path("metrics/gpu")  # where `minbert gpu-unpack` gathers a study by default
PROVENANCE_FILE = "provenance.json"
PROVENANCE_FORMAT = "minbert-gpu-results/1"


def read_provenance(gpu_results: Path) -> dict:
    """``provenance.json`` of the study under ``gpu_results``; empty before its first call."""
    path = Path(gpu_results) / PROVENANCE_FILE
    if not path.is_file():
        return {"format": PROVENANCE_FORMAT, "overrides": None, "calls": {}, "stages": {}, "failures": {}}
    provenance = json.loads(path.read_text(encoding="utf-8"))
    if provenance.get("format") != PROVENANCE_FORMAT:
        raise ValueError(f"{path}: format {provenance.get('format')!r}, expected {PROVENANCE_FORMAT!r}")
    return provenance
