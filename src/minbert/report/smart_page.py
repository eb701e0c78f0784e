"""The SMART page of the report: what SMART's settings rest on at this budget
(``bench/smart_collapse.py``: variants of the runs' settings over seeds, the authors'
perturbation among them) and how its per-token norm was chosen (``bench/smart_norm.py``)."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

from minbert.metrics import Interval
from minbert.report.comparisons import differing, level, ran_at, seed_interval
from minbert.report.formatting import NO_NUMBER, md_header, md_row
from minbert.runs.study_files import (
    NormPoint,
    SmartMeasurement,
    SmartNormSearch,
    SmartVariant,
    VariantRun,
    norm_apart,
    read_smart_measurement,
    read_smart_norm_search,
)
from minbert.runs.training import MultitaskRunFile

_TERMS = ("loss", "adversarial", "bregman")


def smart_collapse_section(
    measurement: SmartMeasurement | None, source: str, runs: dict[str, MultitaskRunFile]
) -> str:
    """``bench/smart_collapse.py``'s variants of the runs' settings (``measurement``: its
    result file): the validation Quora MCC per epoch and seed, how many seeds' Quora heads
    end answering one constant, the validation selection score at the kept epoch against
    the control's (the runs' settings, unchanged) and the first epoch's gradient norms on
    the Quora head; whether the variants depart from the tables' run's settings."""
    if measurement is None:
        return (
            f"No measurement of SMART's variants has been committed (`{source}`; `bench/smart_collapse.py`)."
        )
    found = measurement
    control = found.control
    epochs = max(len(r.quora_mcc) for v in found.variants.values() for r in v.runs)
    changes = sorted({len(v.change) for v in found.variants.values() if v.change})
    counted = {1: "one thing", 2: "two things", 3: "three things"}
    changed = " or ".join(counted.get(n, f"{n} things") for n in changes) or "nothing"
    lines = [
        f"`{found.config}` at the cpu scale, trained once per variant and seed on the training rows "
        f"and scored on the validation split only (dev is never read; seeds "
        f"{', '.join(map(str, found.seeds))}; {found.steps} optimizer steps, encoder lr {found.lr:g}; "
        f"`{source}`, `bench/smart_collapse.py`). Each variant changes {changed} of the runs' "
        "settings (its name says which); the control changes nothing. Quora MCC: per seed, in "
        "the seeds' order; a Quora MCC of 0 is a head answering one constant. The selection "
        "score is the validation one at the epoch the stage keeps. The gradient norms are the "
        "first epoch's means on the Quora head, over the seeds, of the task loss, of lambda_s "
        "times the smoothness term and of mu times the Bregman term (docs/smart.md says what "
        "they show).",
        "",
        *md_header(
            [
                "Variant",
                *(f"Quora MCC, epoch {e}" for e in range(epochs)),
                "Quora one constant at the end",
                "selection (mean)",
                f"control minus it ({level()}, over seeds)",
                "loss",
                "smoothness",
                "Bregman",
            ]
        ),
    ]
    for name, variant in found.variants.items():
        gradient = [statistics.mean(r.first_epoch_quora_gradient[t] for r in variant.runs) for t in _TERMS]
        lines.append(
            md_row(
                [
                    name + (" (the control)" if variant is control else ""),
                    *(_mcc_cells(variant, found.seeds, e) for e in range(epochs)),
                    f"{sum(r.quora_mcc[-1] == 0 for r in variant.runs)} of {len(variant.runs)}",
                    f"{statistics.mean(map(_kept, variant.runs)):.4f}",
                    _lead_cell(control, variant),
                    *(f"{g:.3g}" for g in gradient),
                ]
            )
        )
    return "\n".join([*lines, "", _collapse_verdict(found, control, runs)])


def _mcc_cells(variant: SmartVariant, seeds: list[int], epoch: int) -> str:
    mine = {r.seed: r for r in variant.runs}
    return " / ".join(
        f"{mine[s].quora_mcc[epoch]:.3f}" if s in mine and epoch < len(mine[s].quora_mcc) else NO_NUMBER
        for s in seeds
    )


def _kept(run: VariantRun) -> float:
    return run.selection[run.best_epoch]


def _control_minus(control: SmartVariant | None, variant: SmartVariant) -> list[float]:
    """The control's validation selection score at its kept epoch minus the variant's, per
    seed both ran (none without a control)."""
    theirs = {r.seed: _kept(r) for r in control.runs} if control is not None else {}
    return [theirs[r.seed] - _kept(r) for r in variant.runs if r.seed in theirs]


def _lead_cell(control: SmartVariant | None, variant: SmartVariant) -> str:
    if variant is control:
        return NO_NUMBER
    differences = _control_minus(control, variant)
    above = sum(d > 0 for d in differences)
    return f"{_lead(seed_interval(differences))}, the control above in {above} of {len(differences)}"


def _collapse_verdict(
    found: SmartMeasurement, control: SmartVariant | None, runs: dict[str, MultitaskRunFile]
) -> str:
    words = []
    for name, variant in found.variants.items():
        lead = None if variant is control else seed_interval(_control_minus(control, variant))
        if lead is not None:
            apart = "separate" if lead.low > 0 or lead.high < 0 else "do not separate"
            words.append(f"the control minus {name}: {_lead(lead)}, the seeds {apart} them")
    text = (words[0][0].upper() + "; ".join(words)[1:] + ".") if words else ""
    run = runs.get(found.config)
    if run is None:
        return text + f" The tables hold no `{found.config}` run to compare the settings with."
    differ = differing(found.ran_at, ran_at(run))
    if differ:
        text += (
            f" The variants depart from other settings than the tables' `{found.config}` "
            f"({', '.join(differ)} differ): they were measured elsewhere."
        )
    else:
        text += (
            f" The variants depart from the settings of the tables' `{found.config}` "
            f"({run.steps} optimizer steps): the control is that run at other seeds."
        )
    if control is None:
        return text
    used = {n: asdict(m.settings.smart) for n, m in runs.items() if m.settings.smart}
    off = sorted(n for n, smart in used.items() if smart != control.smart)
    if off:
        return text + f" Not the control's SMART settings: {', '.join(f'`{n}`' for n in off)}."
    return text + (" The tables' runs with SMART use the control's SMART settings." if used else "")


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
            ["token_norm", *(f"seed {s}" for s in seeds), "mean", f"chosen minus it ({level()}, over seeds)"]
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
    differ = differing(search.ran_at, norm_apart(ran_at(run)))
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


def control_repeats(found: SmartMeasurement, search: SmartNormSearch) -> str:
    """Whether the variants' control repeats the norm search's runs at its norm: where both
    ran at the same settings with a seed, the same validation score (the norm search keeps
    four decimals) is a check that the runs are reproducible; a difference is named."""
    control = found.control
    if control is None or differing(search.ran_at, norm_apart(found.ran_at), missing_differs=False):
        return ""
    norm = control.smart["token_norm"]
    theirs = {p.seed: p.selection for p in search.points if p.token_norm == norm}
    mine = {r.seed: _kept(r) for r in control.runs if r.seed in theirs}
    if not mine:
        return ""
    differ = [
        f"seed {s} {mine[s]:.4f} against {theirs[s]:.4f}" for s in mine if abs(mine[s] - theirs[s]) > 5e-5
    ]
    said = f"the norm search's runs at token_norm {norm:g} with seeds {', '.join(map(str, mine))}"
    if differ:
        return f"The control does not repeat {said}: {'; '.join(differ)}."
    return f"The control repeats {said}: the same validation score to four decimals with each."


def smart_page(
    collapse_file: Path | None, norm_file: Path | None, runs: dict[str, MultitaskRunFile]
) -> tuple[list[str], dict[str, set[int]]]:
    """The SMART page (none without either measurement) from ``bench/smart_collapse.py``'s
    and ``bench/smart_norm.py``'s result files, and the seeds each chose with, by file."""
    collapse = None if collapse_file is None else read_smart_measurement(Path(collapse_file))
    search = None if norm_file is None else read_smart_norm_search(Path(norm_file))
    lines, seeds = [], {}
    if collapse_file is not None:
        source = Path(collapse_file).as_posix()
        text = smart_collapse_section(collapse, source, runs)
        if collapse is not None and search is not None:
            text = " ".join(filter(None, [text, control_repeats(collapse, search)]))
        lines += ["## SMART at this budget: what its settings rest on", "", text, ""]
        seeds[source] = set(collapse.seeds) if collapse else set()
    if norm_file is not None:
        source = Path(norm_file).as_posix()
        lines += [
            "## The norm, chosen on validation over seeds",
            "",
            smart_norm_section(search, source, runs),
            "",
        ]
        seeds[source] = {p.seed for p in search.points} if search else set()
    return lines, seeds
