"""What this budget can and cannot detect: every comparison of Tables 2-4 with the smallest
difference of the average its seeds could tell from zero beside the observed one, and,
for a component whose effect is below it, the measured reason (PCGrad: how its
task-gradient cosines fall and how often it projects; SMART: its sign over the seeds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from minbert.report.comparisons import POWER, Compared
from minbert.report.formatting import NO_NUMBER, fmt_signed, md_header, md_row
from minbert.tasks import AVERAGE

_COSINES = ("cos_sst_quora", "cos_sst_sts", "cos_quora_sts")


def pcgrad_reason(conflicts_file: Path) -> str | None:
    """How PCGrad's task-gradient cosines fall over a run, and the share of pairs it
    projected (those with a negative cosine); None without a log."""
    if not Path(conflicts_file).is_file():
        return None
    log = pd.read_csv(conflicts_file)
    if log.empty:
        return None
    cosines = log[list(_COSINES)].to_numpy(float).ravel()
    low, high = np.quantile(cosines, [0.05, 0.95])
    return (
        f"its task-gradient cosines over {len(log)} steps: mean {cosines.mean():+.3f}, 90% between "
        f"{low:+.3f} and {high:+.3f} (|cos| median {np.median(np.abs(cosines)):.3f}); it projected "
        f"{log.conflicts.sum() / log.pairs.sum():.3f} of the pairs, those below zero: near-orthogonal "
        "gradients whose sign is the noise's, so the surgery barely turns them"
    )


def smart_reason(differences: list[float]) -> str:
    """SMART's sign over the seeds (``differences``: without it minus with it, per seed)."""
    higher = sum(d > 0 for d in differences)
    return (
        f"without SMART the average is higher with {higher} of {len(differences)} seeds "
        f"({', '.join(f'{d:+.3f}' for d in differences)})"
    )


def _component(run: dict, parent: dict) -> str | None:
    """The one component two configurations differ in, when it is PCGrad or SMART."""
    ours, theirs = run["settings"], parent["settings"]
    differ = {
        k for k in ("gradient", "smart", "optimizer", "paraphrase_head", "sts_head") if ours[k] != theirs[k]
    }
    if differ == {"gradient"} and {ours["gradient"], theirs["gradient"]} == {"pcgrad", "summed"}:
        return "PCGrad"
    if differ == {"smart"}:
        return "SMART"
    return None


# A comparison's verdict at this budget.
MEASURABLE = "measurable"
NOT_MEASURABLE = "not measurable at this budget"
NOT_STUDIED = "not in the seed study"


def at_this_budget(c: Compared) -> tuple[float | None, float | None, str]:
    """A comparison's mean difference of the average over the seeds, the smallest the seed
    study could detect (None: not in the study), and the verdict on the two."""
    seeds = c.comparison.seeds[AVERAGE] if c.comparison.seeds else None
    detectable = c.comparison.detectable(AVERAGE)
    mean = float(np.mean(seeds)) if seeds else None
    if detectable is None:
        return mean, None, NOT_STUDIED
    return mean, detectable, MEASURABLE if abs(mean) >= detectable else NOT_MEASURABLE


def detectable_section(compared: list[Compared], runs: dict[str, dict], multitask_dir: Path) -> list[str]:
    """One row per comparison of Tables 2-4: the observed difference of the average (dev,
    paired), the seeds' mean and the smallest they could detect, and whether it is
    measurable at this budget; then the reasons for PCGrad and SMART."""
    if not compared:
        return [NO_NUMBER]
    rows, reasons = [], []
    for c in compared:
        seeds = c.comparison.seeds[AVERAGE] if c.comparison.seeds else None
        mean, detectable, verdict = at_this_budget(c)
        rows.append(
            md_row(
                [
                    f"`{c.name}` vs `{c.parent}`",
                    fmt_signed(c.ivs[AVERAGE]),
                    NO_NUMBER if mean is None else f"{mean:+.3f} ({len(seeds)} seeds)",
                    NO_NUMBER if detectable is None else f"{detectable:.3f}",
                    verdict + (f" ({c.comparison.budget})" if c.comparison.budget else ""),
                ]
            )
        )
        component = _component(runs[c.name], runs[c.parent]) if c.name in runs and c.parent in runs else None
        if component == "PCGrad":
            pcgrad = c.parent if runs[c.parent]["settings"]["gradient"] == "pcgrad" else c.name
            said = pcgrad_reason(Path(multitask_dir) / f"{pcgrad}-conflicts.csv")
            if said:
                reasons.append(f"- PCGrad (`{c.name}` vs `{c.parent}`, {verdict}): in `{pcgrad}`, {said}.")
        elif component == "SMART" and seeds:
            sign = seeds if runs[c.name]["settings"]["smart"] is None else [-d for d in seeds]
            reasons.append(f"- SMART (`{c.name}` vs `{c.parent}`, {verdict}): {smart_reason(sign)}.")
    lines = [
        "Each comparison of Tables 2-4: the difference of the average on dev (paired, 95% "
        "interval), the mean of the per-seed differences, and the smallest mean difference the "
        f'seed study could tell from zero ({POWER:.0%} power; section "Seed study"). A '
        "component whose difference is below it is not measurable at this budget: the study can "
        "neither show nor deny its effect.",
        "",
        *md_header(["Comparison", "Δ average (dev)", "Δ over seeds", "Detectable", "At this budget"]),
        *rows,
    ]
    return lines + (["", *reasons] if reasons else [])
