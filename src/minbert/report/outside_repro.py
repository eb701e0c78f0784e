"""The runs `dvc repro` leaves out (``minbert extra-runs``; docs/experiments.md)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from minbert.gpu_study import named_files
from minbert.runs.study_files import EXTRA_RUNS_DIR, EXTRA_RUNS_FILE, ExtraRunsFile, read_extra_runs
from minbert.runs.training import MultitaskRunFile

RERUN = "`minbert extra-runs`"


@dataclass(frozen=True)
class ExtraRuns:
    """The runs that count; of those outside `dvc repro`, which count and which not, why."""

    counted: dict[str, MultitaskRunFile]  # every run of metrics/multitask/ but the refused
    record: ExtraRunsFile | None = None
    kept: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    predictions: dict[str, Path] = field(default_factory=dict)

    def notes(self) -> dict[str, str]:
        ran = f"{RERUN}, outside `dvc repro` (params.yaml's `repro_configs`; provenance.md)"
        return {
            **{c: f"Run by {ran}." for c in self.kept},
            **{c: f"Not counted: {why}; rerun {RERUN}." for c, why in self.refused.items()},
        }

    def lines(self) -> list[str]:
        if not self.kept and not self.refused:
            return []
        out = ["## Runs outside `dvc repro`", ""]
        if self.record is not None:
            names = ", ".join(f"`{c}`" for c in [*self.kept, *self.refused])
            out.append(
                f"`dvc repro` leaves out {names} (params.yaml's `repro_configs`) to stay within its "
                f"time budget (docs/performance.md). {RERUN} ran them as {self.record.how} "
                f"(`{self.record.experiment}`), copying their metrics files into `metrics/multitask/` "
                f"and their dev predictions into `metrics/{EXTRA_RUNS_DIR}/`. A run counts while "
                "every file its stage read (code, settings, the data's manifest) is the one it read "
                f"then (`metrics/{EXTRA_RUNS_FILE}` holds their hashes; a test checks its data folders "
                "against dvc.lock)."
            )
        for config, why in self.refused.items():
            out += ["", f"`{config}` is not counted: {why}. Rerun {RERUN}."]
        return out + [""]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def changed_files(entry: dict, sources: Path) -> list[str]:
    """The files among a stage's dvc.lock deps that differ in ``sources`` now (not folders)."""
    files = [d for d in entry.get("deps", []) if not str(d.get("md5", "")).endswith(".dir")]
    return sorted(d["path"] for d in files if _md5(Path(sources) / d["path"]) != d.get("md5"))


def changed_since(stages: dict[str, dict], sources: Path) -> str | None:
    """Why runs recorded with these dvc.lock entries no longer count (None: every file they
    read is the one it read then)."""
    if not stages:
        return "the stages it ran are not recorded (their dvc.lock entries)"
    changed = sorted({path for entry in stages.values() for path in changed_files(entry, sources)})
    return f"{named_files(changed)} changed since it ran" if changed else None


def extra_runs(
    runs: list[MultitaskRunFile], params: dict | None, metrics_dir: Path, sources: Path
) -> ExtraRuns:
    """Of ``runs``, those ``repro_configs`` leaves out: kept or refused."""
    every = {m.config: m for m in runs}
    if params is None or "repro_configs" not in params:  # a params file of the report's alone
        return ExtraRuns(every)
    record = read_extra_runs(Path(metrics_dir) / EXTRA_RUNS_FILE)
    kept, refused = [], {}
    for config in (c for c in every if c not in params["repro_configs"]):
        entry = (record.stages if record else {}).get(f"multitask@{config}")
        if entry is None:
            refused[config] = f"no run of it is recorded in `metrics/{EXTRA_RUNS_FILE}`"
        elif why := changed_since({config: entry}, sources):
            refused[config] = why
        else:
            kept.append(config)
    folder = (Path(metrics_dir) / EXTRA_RUNS_DIR / "predictions" / "multitask").resolve()
    counted = {c: m for c, m in every.items() if c not in refused}
    return ExtraRuns(counted, record, kept, refused, {f"multitask/{c}": folder / c for c in kept})
