"""What this budget can and cannot detect: every comparison of Tables 2-4 on the average
with its seeds' interval, test and verdict (the one record the tables render), the
smallest difference the seeds could detect as a planning figure, and the measured reason
behind PCGrad's and SMART's comparisons (PCGrad: how its task-gradient cosines fall and
how often it projects; SMART: its sign over the seeds)."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.metrics import Interval
from minbert.report.comparisons import POWER, Compared, fmt_p, ran_at, seed_interval
from minbert.report.formatting import NO_NUMBER, fmt_bound, fmt_signed, md_header, md_row
from minbert.runs.study_files import (
    NormPoint,
    SmartMeasurement,
    SmartNormSearch,
    norm_apart,
    read_smart_measurement,
    read_smart_norm_search,
)
from minbert.runs.training import MultitaskRunFile
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
        f"({', '.join(fmt_bound(d) for d in differences)})"
    )


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
            said = pcgrad_reason(Path(multitask_dir) / f"{pcgrad}-conflicts.csv")
            if said:
                reasons.append(
                    f"- PCGrad (`{c.name}` vs `{c.parent}`, {c.verdict()}): in `{pcgrad}`, {said}."
                )
        elif component == "SMART" and seeds:
            sign = seeds if runs[c.name].settings.smart is None else [-d for d in seeds]
            reasons.append(f"- SMART (`{c.name}` vs `{c.parent}`, {c.verdict()}): {smart_reason(sign)}.")
    lines = [
        "Each comparison of Tables 2-4 on the average: the difference on dev (paired, 95% "
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


# A variant named as params.yaml's was so when it was measured; a table of today's runs keeps
# the claim only while the runs' settings are still that variant's.
PARAMS_CLAIM = " (params.yaml)"


def smart_collapse_section(
    measurement: SmartMeasurement | None, source: str, runs: dict[str, dict] | None = None
) -> str:
    """Why SMART's settings are what they are here: ``bench/smart_collapse.py``'s runs of one
    configuration per variant of SMART's settings (``measurement``: its result file), the
    validation Quora MCC by epoch and the first epoch's gradient norms on the Quora head;
    each variant said to be, or not to be, the settings the tables' runs with SMART used
    (``runs``), and the measurement's steps beside theirs: a choice made elsewhere says so."""
    if measurement is None:
        return (
            f"No measurement of SMART's variants has been committed (`{source}`; `bench/smart_collapse.py`)."
        )
    found = measurement
    variants = found.variants
    epochs = len(next(iter(variants.values())).quora_mcc)
    used = {n: asdict(m.settings.smart) for n, m in (runs or {}).items() if m.settings.smart}
    lines = [
        f"`{found.config}` at the cpu scale, trained once per variant of SMART's settings on the "
        f"validation split (seed {found.seed}, {found.steps} optimizer steps"
        + (f", encoder lr {found.lr:g}" if found.lr is not None else "")
        + "; "
        f"`{source}`, `bench/smart_collapse.py`). A Quora MCC of 0 is a head answering one constant; "
        "the gradient norms are the first epoch's means on the Quora head, of the task loss, "
        "of lambda_s times the smoothness term and of mu times the Bregman term "
        "(docs/smart.md says what they show). A variant's name is the one it was measured under, "
        "less a claim to be params.yaml's that no longer holds (the last column says which are the "
        "runs' settings now).",
        "",
        *md_header(
            [
                "Variant",
                *(f"Quora MCC, epoch {e}" for e in range(epochs)),
                "loss",
                "smoothness",
                "Bregman",
                "The runs' SMART settings",
            ]
        ),
    ]
    matched = []
    for name, variant in variants.items():
        gradient = variant.first_epoch_quora_gradient
        same = [n for n, smart in used.items() if variant.smart == smart]
        matched += same
        lines.append(
            md_row(
                [
                    name if same else name.removesuffix(PARAMS_CLAIM),
                    *(f"{mcc:.3f}" for mcc in variant.quora_mcc),
                    *(f"{gradient[part]:.2f}" for part in ("loss", "adversarial", "bregman")),
                    ", ".join(f"`{n}`" for n in same)
                    if same
                    else ("not recorded" if variant.smart is None else "no"),
                ]
            )
        )
    if used:
        unmatched = [n for n in used if n not in matched]
        steps = ", ".join(f"`{n}` {runs[n].steps}" for n in used)
        lines += [
            "",
            f"The tables' runs with SMART made {steps} optimizer steps against the measurement's "
            f"{found.steps}"
            + (
                f"; the settings of {', '.join(f'`{n}`' for n in unmatched)} ("
                + "; ".join(sorted({_smart_words(used[n]) for n in unmatched}))
                + ") are those of no variant measured here: these variants were measured at other "
                "settings than the committed runs' (the norm's own search, below, says at which it "
                "was chosen)."
                if unmatched
                else "; each ran with the settings of a variant measured here."
            ),
        ]
    return "\n".join(lines)


def _smart_words(smart: dict) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in smart.items())


def smart_norm_section(search: SmartNormSearch | None, source: str, runs: dict[str, MultitaskRunFile]) -> str:
    """SMART's per-token norm as ``bench/smart_norm.py`` chose it (``search``: its result
    file): each norm's validation score per seed, its mean and the chosen norm's paired
    lead; whether the search ran at the settings of the tables' run of its configuration
    (the norm and seed apart) and whether the tables' SMART runs use its choice."""
    if search is None:
        return f"No search of SMART's norm has been committed (`{source}`; `bench/smart_norm.py`)."
    seeds = sorted({p.seed for p in search.points})
    score = {(p.token_norm, p.seed): p for p in search.points}
    chosen, grid = norm_grid(search.points)
    if chosen != search.chosen:
        raise ValueError(f"{source}: chosen token_norm {search.chosen:g}, its points choose {chosen:g}")

    def cell(norm: float, seed: int) -> str:
        p = score.get((norm, seed))
        return NO_NUMBER if p is None else f"{p.selection:.4f}" + (" (start)" if p.best_epoch == 0 else "")

    rows = [
        md_row(
            [
                f"{norm:g}",
                *(cell(norm, s) for s in seeds),
                f"{mean:.4f}",
                "(chosen)" if norm == chosen else _lead(lead),
            ]
        )
        for norm, (mean, lead) in grid.items()
    ]
    lines = [
        f"`{search.config}` at the cpu scale, trained once per norm and seed on the training rows "
        f"and scored on the validation split only (dev is never read; `{source}`, "
        f"`bench/smart_norm.py`): the validation selection score at the epoch the stage keeps "
        "((start): epoch 0, fine-tuning did not beat it). The rule, the rate search's: "
        f"{search.rule}.",
        "",
        *md_header(
            ["token_norm", *(f"seed {s}" for s in seeds), "mean", "chosen minus it (95%, over seeds)"]
        ),
        *rows,
        "",
        _norm_verdict(search, grid, runs),
    ]
    return "\n".join(lines)


def norm_grid(points: list[NormPoint]) -> tuple[float, dict[float, tuple[float, Interval | None]]]:
    """The rate search's rule over SMART's norms: each norm's mean over its seeds, the
    highest chosen (a tie keeps the smaller norm), and per norm its mean and the chosen
    norm minus it over the seeds both ran (None for the chosen, or from fewer than three)."""
    by_norm: dict[float, dict[int, float]] = {}
    for p in points:
        by_norm.setdefault(p.token_norm, {})[p.seed] = p.selection
    means = {n: statistics.mean(scores.values()) for n, scores in sorted(by_norm.items())}
    chosen = max(means, key=lambda n: means[n])
    mine = by_norm[chosen]
    leads = {
        n: None
        if n == chosen
        else seed_interval([mine[s] - scores[s] for s in sorted(set(scores) & set(mine))])
        for n, scores in by_norm.items()
    }
    return chosen, {n: (means[n], leads[n]) for n in means}


def _lead(lead: Interval | None) -> str:
    return NO_NUMBER if lead is None else f"{lead.value:+.4f} [{lead.low:+.4f}, {lead.high:+.4f}]"


def _norm_verdict(search: SmartNormSearch, grid: dict, runs: dict[str, MultitaskRunFile]) -> str:
    others = [n for n in grid if n != search.chosen]
    runner = max(others, key=lambda n: grid[n][0], default=None)
    words = [f"Chosen: token_norm {search.chosen:g}"]
    if runner is not None and grid[runner][1] is not None:
        lead = grid[runner][1]
        words.append(
            f"ahead of the next, {runner:g}, by {_lead(lead)}: "
            + ("the seeds separate them" if lead.low > 0 else "the seeds do not separate them")
        )
    text = ", ".join(words) + "."
    run = runs.get(search.config)
    if run is None:
        return text + f" The tables hold no `{search.config}` run to compare its settings with."
    theirs = norm_apart(ran_at(run))
    differ = sorted(k for k, v in search.ran_at.items() if theirs.get(k) != v)
    text += (
        f" The search ran at the settings of the tables' `{search.config}` but the norm and seed."
        if not differ
        else f" The search ran at other settings than the tables' `{search.config}` ({', '.join(differ)} "
        "differ): the norm was chosen elsewhere."
    )
    used = {n: m.settings.smart.token_norm for n, m in runs.items() if m.settings.smart}
    off = sorted(n for n, norm in used.items() if norm != search.chosen)
    if off:
        return text + f" Not the choice: {', '.join(f'`{n}` {used[n]:g}' for n in off)}."
    return text + (f" The tables' runs with SMART use {search.chosen:g}, the choice." if used else "")


def smart_page(
    collapse_file: Path | None, norm_file: Path | None, runs: dict[str, MultitaskRunFile]
) -> tuple[list[str], dict[str, set[int]]]:
    """The SMART page (none without either measurement) from ``bench/smart_collapse.py``'s
    and ``bench/smart_norm.py``'s result files, and the seeds each chose with, by file."""
    lines, seeds = [], {}
    pages = (
        ("SMART at this budget: what its settings rest on", collapse_file, read_smart_measurement,
         smart_collapse_section, lambda found: {found.seed} - {None}),
        ("The norm, chosen on validation over seeds", norm_file, read_smart_norm_search,
         smart_norm_section, lambda found: {p.seed for p in found.points}),
    )  # fmt: skip
    for title, file, read, section, chosen_with in pages:
        if file is not None:
            found, source = read(Path(file)), Path(file).as_posix()
            lines += [f"## {title}", "", section(found, source, runs), ""]
            seeds[source] = chosen_with(found) if found else set()
    return lines, seeds
