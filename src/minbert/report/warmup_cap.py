"""The head warm-up's pass cap measured (``bench/warmup_cap.py``): how far the starts every
run is compared with sit below converged probes, and which runs' leads over their start are
smaller than that."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minbert.report.formatting import md_header, md_row, span
from minbert.report.notes import history_series, usual
from minbert.runs.study_files import CappedStart, WarmupCapStudy, read_warmup_cap
from minbert.runs.training import MultitaskRunFile
from minbert.tasks import MULTITASK_TASKS, SELECTION, TASKS

TITLE = "The head warm-up's pass cap"


def _median(study: WarmupCapStudy, cap: int) -> str:
    return f"{np.median([s.seconds[cap] for s in study.starts]):.0f}"


def _departures(study: WarmupCapStudy, runs: dict[str, MultitaskRunFile]) -> list[str]:
    """Where the measurement's committed cap at the runs' seed is not what the runs did."""
    found = []
    for c, m in runs.items():
        if m.settings.head_warmup.epochs != study.committed_cap:
            found.append(f"`{c}` allows {m.settings.head_warmup.epochs} passes")
            continue
        start = study.start_of(c, m.seed)
        if start is None:
            found.append(f"`{c}` at seed {m.seed} was not measured")
            continue
        kept, loss = start.kept[study.committed_cap], start.loss[study.committed_cap]
        for task, w in m.head_warmup.items():
            if (kept.get(task), loss.get(task)) != (w.epochs_kept, w.validation_loss_after):
                found.append(
                    f"`{c}`'s {TASKS[task].title} head kept pass {w.epochs_kept} (validation loss "
                    f"{w.validation_loss_after}), here {kept.get(task)} ({loss.get(task)})"
                )
    return found


def _validation_lead(m: MultitaskRunFile, multitask_dir: Path) -> float:
    """The kept epoch's validation selection score minus the start's (its history)."""
    selection = history_series(multitask_dir, m.config, "val", SELECTION)
    return float(selection[m.epoch] - selection[0])


def warmup_cap_section(
    path: Path | None, runs: dict[str, MultitaskRunFile], multitask_dir: Path
) -> list[str]:
    """The section on choices.md from ``bench/warmup_cap.py``'s result file ``path``: the
    measurement, its table by start, and the runs whose validation lead over their start is
    no more than their start's change at the longer cap."""
    head = [f"## {TITLE}", ""]
    source = "bench/results/warmup_cap.json" if path is None else Path(path).as_posix()
    study = None if path is None else read_warmup_cap(Path(path))
    if study is None:
        return [
            *head,
            f"No measurement of the warm-up's cap has been committed (`{source}`; `bench/warmup_cap.py`).",
            "",
        ]
    short, long = study.committed_cap, study.cap
    departed = study.problems + _departures(study, runs)
    if departed:
        return [
            *head,
            f"`{source}` ({study.started[:10]}) was measured at other settings than the runs': "
            f"{'; '.join(departed)}. Rerun `python bench/warmup_cap.py`.",
            "",
        ]
    fits = [(s, task) for s in study.starts for task in s.kept[short]]
    at_short = sum(s.kept[short][t] == short for s, t in fits)
    at_long = sum(s.kept[long][t] == long for s, t in fits)
    latest = max(s.kept[long][t] for s, t in fits)
    changes = [s.selection[long] - s.selection[short] for s in study.starts]
    by_start: dict[str, list[CappedStart]] = {}
    for s in study.starts:
        by_start.setdefault(s.configs[0], []).append(s)
    said = (
        f"`bench/warmup_cap.py` (`{source}`, {study.started[:10]}) fitted the heads of each of the "
        f"{len(by_start)} distinct starts of the cpu scale as their stages fit them, at the runs' cap of "
        f"{short} passes and at {long}, with seeds {', '.join(map(str, study.seeds))} (the tables' and the "
        f"seed study's), scoring validation only. At {short} passes {at_short} of the {len(fits)} fits keep "
        f"their last allowed pass; at {long}, {at_long} do (the latest pass kept: {latest}). The longer cap "
        f"moves a start's validation selection score by {np.mean(changes):+.4f} on average (from "
        f"{min(changes):+.4f} to {max(changes):+.4f} over the {len(changes)} starts and seeds), and the "
        f"warm-up's time from {_median(study, short)} to {_median(study, long)} seconds a start (median). "
        "At the tables' seed the runs' cap gives back every stage's warm-up and epoch-0 score (the control)."
    )
    header = [
        "start (the configurations sharing it)",
        f"passes kept at {short} / at {long}: " + "; ".join(TASKS[t].title for t in MULTITASK_TASKS),
        f"selection at {short}",
        f"at {long}",
        "change: mean (range)",
    ]
    lines = [*head, said, "", *md_header(header)]
    for starts in by_start.values():
        kept = [
            f"{span([s.kept[short][t] for s in starts])} / {span([s.kept[long][t] for s in starts])}"
            if t in starts[0].kept[short]
            else "—"
            for t in MULTITASK_TASKS
        ]
        moved = [s.selection[long] - s.selection[short] for s in starts]
        lines.append(
            md_row(
                [
                    ", ".join(f"`{c}`" for c in starts[0].configs),
                    "; ".join(kept),
                    f"{np.mean([s.selection[short] for s in starts]):.4f}",
                    f"{np.mean([s.selection[long] for s in starts]):.4f}",
                    f"{np.mean(moved):+.4f} ({min(moved):+.4f} to {max(moved):+.4f})",
                ]
            )
        )
    return [*lines, "", _against_leads(study, runs, multitask_dir), ""]


def _against_leads(study: WarmupCapStudy, runs: dict[str, MultitaskRunFile], multitask_dir: Path) -> str:
    """The runs whose validation lead over their start is no more than the longer cap
    moves that start (at the runs' own seed)."""
    short, long = study.committed_cap, study.cap
    below = {}
    for c, m in runs.items():
        start = study.start_of(c, m.seed)
        lead, change = _validation_lead(m, multitask_dir), start.selection[long] - start.selection[short]
        if lead <= change:
            below[c] = f"`{c}` {lead:+.4f} against {change:+.4f}"
    seed = usual({c: str(m.seed) for c, m in runs.items()})
    if below:
        found = (
            f"{len(below)} of the {len(runs)} runs lead their start on validation (the kept epoch minus "
            f"epoch 0) by no more than the longer cap moves that start: {'; '.join(below.values())}. For "
            "those the converged probe alone scores at least as high on validation as the kept epoch did, "
            "so their lead over the start (controls.md) may be the probe's shortfall, not fine-tuning's."
        )
    else:
        found = "every run leads its start on validation by more than the longer cap moves that start."
    return (
        f"Against the runs' own leads (seed {seed}): {found} Raising the cap changes every run's start, "
        "and with it the rate search and the seed study: the runs keep the cap they were searched and "
        "seeded at."
    )
