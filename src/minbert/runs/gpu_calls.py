"""The GPU study's provenance (``metrics/gpu/provenance.json``), typed both ways: every
call a node made (``GpuCall``), each stage's newest results (``GpuStageResult``) and the
stages whose last call failed. ``minbert gpu-unpack`` writes it
(``minbert.offline.gpu_results``); the report, ``gpu-status``, ``gpu-plan`` and ``minbert
readme`` read it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from minbert.atomic import atomic_write_text

PROVENANCE_FILE = "provenance.json"
PROVENANCE_FORMAT = "minbert-gpu-results/1"


@dataclass(frozen=True)
class CheckpointCopy:
    """The checkpoint a call sent the node: its name, its weights' file and sha256, and
    the copy made of them (fp16) with what that means."""

    name: str
    source_weights: str | None = None
    source_sha256: str | None = None
    copy: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Unfinished:
    """A stage a call did not finish: failed (how it ran until then) or not run."""

    stage: str
    reason: str
    seconds: float | None = None
    lanes: int | None = None
    shared_with: list[str] | None = None
    threads: int | None = None
    peak_device_memory_bytes: int | None = None
    log: str | None = None


@dataclass(frozen=True)
class GpuCall:
    """One ``minbert offline-run`` call: where and at which commit it ran, its stages'
    seconds, which shared the GPU with which (lanes) and their peak device memory."""

    commit: str
    uncommitted_changes: list[str]
    device: str
    torch: str
    cuda: str | None
    python: str
    checkpoint: CheckpointCopy
    seconds: float
    finished: dict[str, float]
    failed: list[Unfinished]
    not_run: list[Unfinished]
    lanes: int = 1
    threads: int | None = None
    shared_with: dict[str, list[str]] = field(default_factory=dict)
    peak_device_memory_bytes: dict[str, int | None] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict) -> GpuCall:
        return cls(
            **{
                **values,
                "checkpoint": CheckpointCopy(**values["checkpoint"]),
                "failed": [Unfinished(**f) for f in values["failed"]],
                "not_run": [Unfinished(**f) for f in values["not_run"]],
            }
        )


@dataclass(frozen=True)
class GpuStageResult:
    """A stage's newest results: the call that made them, its seconds there, the files it
    brought back, the fingerprint it ran with (code, settings, command) and its log."""

    call: str
    seconds: float
    files: list[str]
    fingerprint: dict[str, str]
    log: str | None


@dataclass(frozen=True)
class GpuFailure:
    """A stage whose newest call failed it (and that has no newer results)."""

    call: str
    reason: str
    log: str | None
    traceback: str | None


@dataclass(frozen=True)
class GpuProvenance:
    format: str
    overrides: list[str] | None  # the `dvc exp run -S` settings of the study; None: no call yet
    calls: dict[str, GpuCall]  # by the node's start time
    stages: dict[str, GpuStageResult]
    failures: dict[str, GpuFailure]
    manifest: dict | None = None  # the data stage's, which the calls' plan was resolved from

    def ran_at(self, stage: str) -> str:
        """The commit a stage's results ran at (its call's), shortened."""
        return self.calls[self.stages[stage].call].commit[:7]


EMPTY = GpuProvenance(PROVENANCE_FORMAT, None, {}, {}, {})


def read_gpu_provenance(gpu_results: Path) -> GpuProvenance:
    """The provenance of the study under ``gpu_results``; empty before its first call."""
    path = Path(gpu_results) / PROVENANCE_FILE
    if not path.is_file():
        return EMPTY
    values = json.loads(path.read_text(encoding="utf-8"))
    if values.get("format") != PROVENANCE_FORMAT:
        raise ValueError(f"{path}: format {values.get('format')!r}, expected {PROVENANCE_FORMAT!r}")
    known = {f.name for f in fields(GpuProvenance)}
    if values.keys() - known:
        raise ValueError(
            f"{path}: unknown {', '.join(sorted(values.keys() - known))}: rewrite it with gpu-unpack"
        )
    return GpuProvenance(
        values["format"],
        values["overrides"],
        {k: GpuCall.from_dict(c) for k, c in values["calls"].items()},
        {k: GpuStageResult(**s) for k, s in values["stages"].items()},
        {k: GpuFailure(**f) for k, f in values["failures"].items()},
        values.get("manifest"),
    )


def write_gpu_provenance(gpu_results: Path, provenance: GpuProvenance) -> None:
    """``provenance.json``, its calls and stages in order."""
    values = asdict(provenance)
    values["calls"] = dict(sorted(values["calls"].items()))
    values["stages"] = dict(sorted(values["stages"].items()))
    for call in values["calls"].values():
        for entry in call["failed"] + call["not_run"]:  # what the node did not say, left out
            for key in [k for k, v in entry.items() if v is None]:
                del entry[key]
    if values["manifest"] is None:
        del values["manifest"]
    atomic_write_text(Path(gpu_results) / PROVENANCE_FILE, json.dumps(values, indent=2) + "\n")
