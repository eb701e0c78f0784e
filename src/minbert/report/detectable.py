"""What this budget can and cannot detect: every comparison of Tables 2-4 on the average
with its seeds' interval, test and verdict (the one record the tables render), the
smallest difference the seeds could detect as a planning figure, and the measured reason
behind PCGrad's and SMART's comparisons (PCGrad: how its task-gradient cosines fall and
how often it projects; SMART: its sign over the seeds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from minbert.report.comparisons import POWER, Compared, fmt_p, level
from minbert.report.formatting import NO_NUMBER, fmt_bound, fmt_signed, md_header, md_row
from minbert.results import CONFLICTS, COSINE_COLUMNS, run_log
from minbert.tasks import AVERAGE

# A median |cosine| below this: the task gradients are close to orthogonal.
NEAR_ORTHOGONAL = 0.1


def pcgrad_reason(conflicts_file: Path) -> str | None:
    """How PCGrad's task-gradient cosines fall over a run, and the share of pairs it
    projected (those with a negative cosine); None without a log."""
    if not Path(conflicts_file).is_file():
        return None
    log = pd.read_csv(conflicts_file)
    if log.empty:
        return None
    cosines = log[list(COSINE_COLUMNS)].to_numpy(float).ravel()
    low, high = np.quantile(cosines, [0.05, 0.95])
    size, share = np.median(np.abs(cosines)), log.conflicts.sum() / log.pairs.sum()
    # Read as "barely turned" only where the log shows it: small cosines of either sign alike.
    reading = (
        ": near-orthogonal gradients, below zero about as often as above, so the surgery barely turns them"
        if size < NEAR_ORTHOGONAL and abs(share - 0.5) < 0.1
        else ""
    )
    return (
        f"its task-gradient cosines (`{Path(conflicts_file).as_posix()}`) over {len(log)} steps: "
        f"mean {cosines.mean():+.3f}, 90% between {low:+.3f} and {high:+.3f} (|cos| median "
        f"{size:.3f}); it projected {share:.3f} of the pairs, those below zero{reading}"
    )


def smart_reason(differences: list[float], detectable: float | None) -> str:
    """SMART's differences over the seeds (``differences``: without it minus with it, per
    seed), beside the smallest difference those seeds would detect: their signs alone are
    no verdict."""
    said = f"without SMART minus with it, seed by seed: {', '.join(fmt_bound(d) for d in differences)}"
    if detectable is not None:
        said += f" (the smallest difference these seeds would detect: {detectable:.3f})"
    return said


def _component(run: dict, parent: dict) -> str | None:
    """The one component two configurations differ in, when it is PCGrad or SMART."""
    ours, theirs = run.settings, parent.settings
    differ = {
        k
        for k in ("gradient", "smart", "optimizer", "paraphrase_head", "sts_head")
        if getattr(ours, k) != getattr(theirs, k)
    }
    if differ == {"gradient"} and {ours.gradient, theirs.gradient} == {"pcgrad", "summed"}:
        return "PCGrad"
    if differ == {"smart"}:
        return "SMART"
    return None


def detectable_section(compared: list[Compared], runs: dict[str, dict], multitask_dir: Path) -> list[str]:
    """One row per comparison of Tables 2-4: the difference of the average on dev (paired),
    over the seeds with the test's p (raw and adjusted within its family) and its verdict,
    the record the tables render; then the smallest difference the seeds could detect, a
    planning figure for the next study; then the reasons for PCGrad and SMART."""
    if not compared:
        return [NO_NUMBER]
    rows, reasons = [], []
    for c in compared:
        seeds = c.comparison.seeds[AVERAGE] if c.comparison.seeds else None
        over = c.comparison.over_seeds(AVERAGE)
        p, adjusted = c.comparison.p(AVERAGE), c.comparison.p_adjusted(AVERAGE)
        detectable = c.comparison.detectable(AVERAGE)
        rows.append(
            md_row(
                [
                    f"`{c.name}` vs `{c.parent}`",
                    c.cell(),
                    NO_NUMBER if over is None else f"{fmt_signed(over)} ({len(seeds)} seeds)",
                    NO_NUMBER if p is None else f"{fmt_p(p)} / {fmt_p(adjusted)}",
                    c.verdict(),
                    NO_NUMBER if detectable is None else f"{detectable:.3f}",
                ]
            )
        )
        component = _component(runs[c.name], runs[c.parent]) if c.name in runs and c.parent in runs else None
        if component == "PCGrad":
            pcgrad = c.parent if runs[c.parent].settings.gradient == "pcgrad" else c.name
            said = pcgrad_reason(run_log(multitask_dir, pcgrad, CONFLICTS))
            if said:
                reasons.append(
                    f"- PCGrad (`{c.name}` vs `{c.parent}`, {c.verdict()}): in `{pcgrad}`, {said}."
                )
        elif component == "SMART" and seeds:
            sign = seeds if runs[c.name].settings.smart is None else [-d for d in seeds]
            said = smart_reason(sign, detectable)
            reasons.append(f"- SMART (`{c.name}` vs `{c.parent}`, {c.verdict()}): {said}.")
    lines = [
        f"Each comparison of Tables 2-4 on the average: the difference on dev (paired, {level()} "
        "interval, with its mark), the paired interval over the seeds both rows were trained "
        "with, the seeds' t-test p raw and after Holm's adjustment over the comparisons with "
        "the same parent, and the one verdict the tables, the Summary and the seed study give "
        'it (tables.md, "How to read the tables"). Detectable: the smallest mean difference these seeds '
        f"would tell from zero {POWER:.0%} of the time ((t + t_power) · sd / √n): a planning "
        "figure for the next study's seed count, not a verdict on any observed difference, "
        "which its interval over seeds states.",
        "",
        *md_header(
            ["Comparison", "Δ average (dev)", "Δ over seeds", "p / adjusted", "Verdict", "Detectable"]
        ),
        *rows,
    ]
    return lines + (["", *reasons] if reasons else [])
