"""The report's MLM section: pretraining before fine-tuning, from the pipeline's own stages
or from the experiment ``minbert mlm-study`` committed (the default pipeline leaves
``mlm.pretrain`` empty to keep within its time budget)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minbert.report.comparisons import (
    Compared,
    Comparison,
    budget_gap,
    differing,
    fmt_budget,
    fmt_difference,
    multitask_scored,
    ran_at,
)
from minbert.report.evidence import Evidence
from minbert.report.formatting import (
    COLUMN_TITLES,
    COLUMNS,
    NO_NUMBER,
    fmt_interval,
    fmt_setting,
    md_header,
    md_row,
)
from minbert.runs.study_files import MlmStudyFile
from minbert.runs.training import MultitaskRunFile
from minbert.tasks import AVERAGE, MULTITASK_TASKS

# What `minbert mlm-study` (minbert.tools.mlm_study) writes under the metrics folder: the
# experiment's metrics files and records by stage folder, the fine-tuned runs' dev
# predictions, and where they came from.
MLM_STUDY_DIR = "mlm-study"
MLM_PROVENANCE = "study.json"
MLM_PREDICTIONS = "predictions"


@dataclass(frozen=True)
class MlmRuns:
    """MLM pretraining's runs as the report reads them: the pipeline's own stages', or those
    of the experiment ``minbert mlm-study`` ran (``study``: its provenance; ``predictions``:
    the folder its dev predictions were copied to)."""

    pretraining: dict[str, dict]
    tuned: list[dict]
    study: MlmStudyFile | None = None
    predictions: Path | None = None
    refused: str | None = None  # why the study's runs do not count (counted_runs.mlm_runs)


TASK_KEYS = (*MULTITASK_TASKS, AVERAGE)


def tuned_name(run: MultitaskRunFile) -> str:
    """A run fine-tuned from an MLM checkpoint as its stage names it (`multitask-mlm@<start>-<config>`)."""
    return f"{run.pretraining.start}-{run.config}"


def ran_otherwise(run: MultitaskRunFile, base: MultitaskRunFile) -> list[str]:
    """What ``run`` (fine-tuned from an MLM checkpoint) ran at that ``base`` (the same
    configuration from the original checkpoint) holds otherwise, ``name then (now now)``."""
    mine, theirs = ran_at(run), ran_at(base)
    return [f"{k} {fmt_setting(mine[k])} (now {fmt_setting(theirs.get(k))})" for k in differing(mine, theirs)]


def mlm_section(mlm: MlmRuns, runs: dict[str, dict], evidence: Evidence) -> str:
    """Pretraining metrics, then each configuration fine-tuned from an MLM checkpoint
    beside the same configuration fine-tuned from the original checkpoint."""
    if mlm.refused:
        return (
            f"The MLM study `{mlm.study.experiment}` ({mlm.study.how}) is not counted: {mlm.refused}. "
            f"Rerun `{mlm.study.command}`."
        )
    if not mlm.pretraining:
        return (
            "MLM pretraining was not run with these parameters (`mlm.pretrain` is empty) and "
            "no MLM study is committed. Run it with `minbert mlm-study` (an experiment beside "
            "the default pipeline: MLM pretraining from `continue`, then the configurations in "
            "`mlm.finetune` fine-tuned again from its checkpoint), or switch it on in the "
            "pipeline with `dvc exp run -S 'mlm.pretrain=[continue]'`."
        )
    pretraining, tuned, study = mlm.pretraining, mlm.tuned, mlm.study
    intro = []
    if study is not None:
        intro = [
            "Not part of the default `dvc repro`, which leaves `mlm.pretrain` empty to keep "
            f"within its time budget: `{study.command}` ran it as the experiment "
            f"`{study.experiment}` ({study.how}) and copied its metrics files and dev "
            "predictions to `metrics/mlm-study/`. It counts while every file its stages read "
            f"(code, settings, the data's manifest) is the one they read then (`metrics/{MLM_STUDY_DIR}/"
            f"{MLM_PROVENANCE}` holds their hashes).",
            "",
        ]
    lines = intro + md_header(
        [
            "MLM start",
            "masked-token accuracy before",
            "after",
            "perplexity before",
            "after",
            "training sequences",
            "held-out sequences",
            "MLM head",
        ]
    )
    for start, m in pretraining.items():
        b, c = m.before, m.corpus
        lines.append(
            md_row(
                [
                    f"`{start}`",
                    f"{b.masked_accuracy:.3f}",
                    f"{m.accuracy:.3f}",
                    f"{b.perplexity:.1f}",
                    f"{m.after.perplexity:.1f}",
                    str(c.train_sequences),
                    str(c.heldout_sequences),
                    m.head,
                ]
            )
        )
    lines += [
        "",
        "Masked-token accuracy and perplexity are measured on held-out sequences of the "
        "training text (masks drawn once, the same positions before and after); "
        "no dev or test text is in the pretraining corpus. A checkpoint without an MLM "
        "head (a sentence-embedding model drops it) starts from a fresh one: its "
        "'before' is a random head's, so the 'after' measures that head's training with the "
        "encoder's.",
        "",
    ]
    lines += md_header(
        [
            "Configuration",
            "Fine-tuned from",
            *(f"{COLUMN_TITLES[c]} (ours)" for c in COLUMNS),
            "Steps / examples",
            "Δ average vs without MLM",
        ]
    )
    notes = []
    for m in sorted(tuned, key=lambda m: (m.config, m.pretraining.start)):
        name = tuned_name(m)
        folder = "multitask-mlm" if mlm.predictions is None else str(mlm.predictions / "multitask-mlm")
        scored = multitask_scored(evidence, folder, name, m)
        base = runs.get(m.config)
        if base and study is not None:
            then = study.compared_with.get(m.config, {})
            otherwise = ran_otherwise(m, base)
            if otherwise or any(then.get(k) != base.scores[k] for k in TASK_KEYS):
                # The study's comparison is with a run that is no longer the current one.
                said = (
                    f"ran at other settings than the current `{m.config}`: {'; '.join(otherwise)}"
                    if otherwise
                    else f"`{m.config}` has been retrained since the MLM study at the same settings "
                    f"(then {then.get(AVERAGE)}, now {base.scores[AVERAGE]} average)"
                )
                notes.append(f"- `{name}`: {said}; no difference is shown; rerun `{study.command}`.")
                base = None
        base_scored = multitask_scored(evidence, "multitask", m.config, base) if base else None
        # Not in the seed study: the sign across seeds is not checked.
        comparison = Comparison(budget=budget_gap(m, base)) if base else None
        for run, s, origin in ((base, base_scored, "original"), (m, scored, "MLM")):
            if run is None:
                continue
            cells = [f"`{m.config}`", f"`{run.checkpoint.name}`"]
            cells += [fmt_interval(evidence.column(s, c)) for c in COLUMNS]
            cells.append(fmt_budget(run))
            delta = (
                "(parent)"
                if origin == "original"
                else fmt_difference(evidence.average_difference(s, base_scored), comparison)
                if base_scored
                else NO_NUMBER
            )
            lines.append(md_row(cells + [delta]))
        if base_scored:
            ivs = {c: evidence.column_difference(scored, base_scored, c) for c in COLUMNS}
            notes.append(Compared(name, m.config, ivs, comparison).sentence())
    lead = ["", "Δ: ours minus the same configuration fine-tuned from the original checkpoint."]
    return "\n".join(lines + lead + (["", *notes] if notes else []))
