"""The runs the report reads: a multitask stage's, and MLM pretraining's (the pipeline's, or
`minbert mlm-study`'s while every file its stages read is unchanged)."""

from __future__ import annotations

from pathlib import Path

from minbert.report.outside_repro import changed_since
from minbert.report.pretraining import MLM_PREDICTIONS, MLM_PROVENANCE, MLM_STUDY_DIR, MlmRuns
from minbert.runs.study_files import read_mlm_study
from minbert.runs.training import MlmRunFile, MultitaskRunFile, read_runs


def load_runs(directory: Path) -> list[MultitaskRunFile]:
    """A multitask stage's runs, each with SMART's measured terms when SMART was on."""
    runs = read_runs(MultitaskRunFile, directory)
    for m in runs:
        if m.settings.smart and m.smart is None:
            raise ValueError(
                f"{directory}/{m.config}.json: missing key(s) smart (SMART's adversarial term and "
                "its control): written by an older stage; rerun it (dvc repro)"
            )
    return runs


def mlm_runs(metrics_dir: Path, sources: Path) -> MlmRuns:
    """The pipeline's MLM runs, or where it ran none (the default) the committed study's,
    counted while its stages' files in ``sources`` (the repository) are unchanged."""
    pretraining = {m.start: m for m in read_runs(MlmRunFile, metrics_dir / "mlm")}
    if pretraining:
        return MlmRuns(pretraining, load_runs(metrics_dir / "multitask-mlm"))
    study = metrics_dir / MLM_STUDY_DIR
    if not (study / MLM_PROVENANCE).is_file():
        return MlmRuns({}, [])
    record = read_mlm_study(study / MLM_PROVENANCE)
    if why := changed_since(record.stages, sources):
        return MlmRuns({}, [], record, refused=why)
    return MlmRuns(
        {m.start: m for m in read_runs(MlmRunFile, study / "mlm")},
        load_runs(study / "multitask-mlm"),
        record,
        # Absolute: the evidence reads it in place of its own predictions folder.
        (study / MLM_PREDICTIONS).resolve(),
    )
