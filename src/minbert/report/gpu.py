"""The report's GPU section: the `gpu` scale's study as `minbert gpu-unpack` gathered it
under ``metrics/gpu`` (docs/gpu-node.md), Tables 1-4 beside the paper's, and each call
that produced it (device, torch, CUDA, commit, command, seconds)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minbert.gpu_study import GPU_RESULTS_DIR, named_files
from minbert.report.comparisons import Compared
from minbert.report.evidence import Evidence
from minbert.report.formatting import md_header, md_row
from minbert.report.notes import with_facts
from minbert.report.tables import arm_ends, judged_comparisons, multitask_table, table1
from minbert.runs.gpu_calls import GpuProvenance
from minbert.runs.training import MultitaskRunFile, SentimentRunFile, ZeroShotRunFile
from minbert.tasks import MULTITASK_TASKS, TASKS

# Under the metrics folder: the GPU study, which mirrors the repository's metrics/ and
# predictions/ (minbert.offline.gpu_results).
GPU_ROOT = Path(GPU_RESULTS_DIR.name)
GPU_METRICS, GPU_PREDICTIONS = GPU_ROOT / "metrics", GPU_ROOT / "predictions"


@dataclass
class GpuStudy:
    """What ``metrics/gpu`` holds: the runs (as the report loads the CPU study's) and
    ``provenance.json``."""

    sentiment: list[SentimentRunFile]
    multitask: dict[str, MultitaskRunFile]
    zero_shot: ZeroShotRunFile | None
    provenance: GpuProvenance
    evidence: Evidence
    stale: dict[str, list[str]]  # each stage's code files changed since it ran (gpu_study.changed_code)
    multitask_dir: Path  # its multitask runs' files (histories, for the notes' facts)

    def stale_note(self, stage: str) -> str | None:
        """What a row of ``stage`` says when its code changed after it ran."""
        if not self.stale.get(stage):
            return None
        return (
            f"Stale: `{stage}` ran at {self.provenance.ran_at(stage)}; since then "
            f"{named_files(self.stale[stage])} changed (`minbert gpu-status`), so this row is not what "
            "the code gives now until a call runs it again."
        )


def calls_table(provenance: GpuProvenance) -> list[str]:
    """One row per call: when, where, from which commit, in how many lanes, what it finished
    and failed."""
    lines = md_header(
        [
            "call (node clock, UTC)",
            "device",
            "torch / CUDA",
            "commit",
            "seconds",
            "lanes",
            "finished",
            "failed",
        ]
    )
    for started, call in sorted(provenance.calls.items()):
        commit = call.commit[:7] + (" + changes" if call.uncommitted_changes else "")
        finished = ", ".join(f"`{s}` {t:.0f} s" for s, t in call.finished.items())
        failed = "; ".join(f"`{f.stage}`: {f.reason}" for f in call.failed + call.not_run)
        lines.append(
            md_row(
                [
                    started[:19],
                    call.device,
                    f"{call.torch} / {call.cuda}",
                    commit,
                    f"{call.seconds:.0f}",
                    str(call.lanes),
                    finished or "—",
                    failed or "—",
                ]
            )
        )
    return lines


def results_table(study: GpuStudy) -> list[str]:
    """One row per stage with results: the call and commit it ran at, and the code files
    that changed since (none: current)."""
    lines = md_header(["stage", "call (node clock, UTC)", "commit", "code changed since"])
    for stage, known in sorted(study.provenance.stages.items()):
        changed = study.stale.get(stage)
        cells = [f"`{stage}`", known.call[:19], study.provenance.ran_at(stage)]
        lines.append(md_row([*cells, named_files(changed, 6) if changed else "none"]))
    return lines


def _specs(study: GpuStudy, paper: dict, multitask_tables: list[str]) -> dict[str, dict]:
    return {
        name: with_facts(paper[name], study.multitask, study.multitask_dir)
        for name in multitask_tables
        if name in paper
    }


def gpu_comparisons(study: GpuStudy, paper: dict, multitask_tables: list[str]) -> list[Compared]:
    """Every comparison of the `gpu` scale's Tables 2-4 once, judged within its family:
    what its page and the first page's GPU columns render."""
    return judged_comparisons(
        list(_specs(study, paper, multitask_tables).values()), study.multitask, study.evidence
    )


def gpu_section(
    study: GpuStudy | None, paper: dict, multitask_tables: list[str], judged: list[Compared]
) -> list[str]:
    """The section's lines (``judged``: ``gpu_comparisons``); ``None``: no call has been
    unpacked yet."""
    if study is None:
        return [
            "No GPU results yet: the `gpu` scale's study runs on a GPU node (docs/gpu-node.md) and "
            "`minbert gpu-unpack` gathers it under `metrics/gpu/`.",
        ]
    overrides = " ".join(f"-S '{o}'" for o in study.provenance.overrides)
    stages = study.provenance.stages
    # A table row's note, by its name: a configuration's, or the untrained checkpoint's.
    rows = [s for s in stages if s.startswith("multitask@") or s == "zero-shot"]
    config_notes = {s.split("@", 1)[-1]: study.stale_note(s) for s in rows}
    task_notes = {
        task: " ".join(n for s in stages if s.startswith(f"sentiment@{task}-") if (n := study.stale_note(s)))
        for task in {m.task for m in study.sentiment}
    }
    checkpoints = {c.checkpoint.name: c.checkpoint for c in study.provenance.calls.values()}
    sizes = ", ".join(
        f"{TASKS[t].title} {len(study.evidence.labels(t)):,}"
        for t in MULTITASK_TASKS
        if any(t in m.scores for m in study.multitask.values())
    )
    lines = [
        f"The study of `dvc exp run {overrides}`: every training row, the paper's epochs where "
        "the scale says so, scored on every dev example"
        + (f" ({sizes})" if sizes else "")
        + ". It ran on a GPU node without DVC, one `minbert offline-run` call at a time "
        "(docs/gpu-node.md), and was gathered here from `metrics/gpu/`; `minbert gpu-status` "
        "says which stages are current for this commit. Checkpoint: "
        + "; ".join(f"`{name}` ({c.note})" for name, c in checkpoints.items())
        + ". A configuration not yet run says so; no seed study covers this scale, so each "
        "difference is one run's (its interval covers the dev examples, not the seeds).",
        "",
        *calls_table(study.provenance),
        "",
        "A call's stage seconds are each stage's own wall time; with several lanes, stages ran side "
        "by side on the one GPU (the call's seconds are the whole), so a stage's seconds include "
        "waiting for the GPU its neighbours held and are not comparable with one lane's.",
        "",
        "Each stage's results, the commit they ran at, and the code files (its own and its "
        "upstream stages') that differ in this commit: a row of a table below whose code changed "
        "is marked stale there.",
        "",
        *results_table(study),
        "",
        f"### GPU Table 1: {paper['table1']['title']}",
        "",
        table1(
            study.sentiment,
            paper["table1"],
            study.evidence,
            task_notes,
            arm_ends(study.sentiment, study.multitask_dir.parent / "sentiment"),
        ),
        "",
    ]
    specs = _specs(study, paper, multitask_tables)
    for number, name in enumerate(multitask_tables, start=2):
        if name in specs:
            text, _ = multitask_table(
                specs[name],
                study.multitask,
                study.evidence,
                study.zero_shot,
                row_notes=config_notes,
                judged=judged,
            )
            lines += [f"### GPU Table {number}: {paper[name]['title']}", "", text, ""]
    return lines
