"""What the report found, in plain words, from the same evidence as its tables; no number
here is written by hand."""

from __future__ import annotations

from minbert.metrics import Interval
from minbert.report.comparisons import (
    BUDGETS_DIFFER,
    SHOWN,
    Compared,
    SeedRuns,
    budget_gap,
    level,
    multitask_scored,
)
from minbert.report.controls import Starts, lower_higher
from minbert.report.evidence import Evidence
from minbert.report.formatting import (
    COLUMN_TITLES,
    COLUMNS,
    NO_NUMBER,
    SELECTION_MEAN,
    fmt_signed,
    md_header,
    md_row,
)
from minbert.report.notes import training_budget, usual
from minbert.tasks import AVERAGE, MULTITASK_TASKS, SELECTION


def against_untrained(runs: dict[str, dict], zero_shot: dict, evidence: Evidence) -> dict[str, dict]:
    """Each configuration minus the untrained checkpoint, per column (paired intervals)."""
    base = multitask_scored(evidence, "zero-shot", "", zero_shot)
    out = {}
    for name, run in runs.items():
        scored = multitask_scored(evidence, "multitask", name, run)
        out[name] = {c: evidence.column_difference(scored, base, c) for c in COLUMNS}
    return out


def _tasks_below(deltas: dict[str, dict[str, Interval]]) -> str:
    worse = [(t, sum(d[t].high < 0 for d in deltas.values())) for t in MULTITASK_TASKS]
    return ", ".join(f"{COLUMN_TITLES[t]} in {k}" for t, k in worse if k)


def untrained_sentence(
    runs: dict[str, dict],
    zero_shot: dict,
    deltas: dict[str, dict],
    over: dict[str, dict],
    study: SeedRuns | None,
    seed: str,
) -> str:
    """Fine-tuning against the untrained checkpoint: over the seeds where the study has
    them (``over``), then with the tables' ``seed`` alone on its dev intervals (``deltas``)."""
    means = study.means(zero_shot.config) if study else None
    if not over or means is None:
        untrained = ", ".join(f"{COLUMN_TITLES[t]} {zero_shot.scores[t]:.3f}" for t in MULTITASK_TASKS)
        worse = _tasks_below(deltas)
        return (
            f"Against the untrained checkpoint (average {zero_shot.scores[AVERAGE]:.3f}), with the tables' "
            f"seed {seed} (the seed study has not fitted the checkpoint's probes with its seeds), "
            f"the fine-tuned average is {lower_higher(deltas, len(runs))} of the {len(runs)} "
            "configurations (paired intervals excluding zero)"
            + (f"; per task, the runs scored below the checkpoint on {worse}" if worse else "")
            + f" (untrained: {untrained}; the checkpoint note above says what it was trained on)."
        )
    untrained = ", ".join(f"{COLUMN_TITLES[t]} {means[t]:.3f}" for t in MULTITASK_TASKS)
    worse = _tasks_below(over)
    fitted = len(study.configs[zero_shot.config])
    return (
        f"Against the untrained checkpoint (average {means[AVERAGE]:.3f}, the mean over its {fitted} "
        "seeds: its SST probe and Quora threshold are fitted on each seed's training rows), each "
        "configuration minus the checkpoint with the same seed, over the seeds both ran with "
        "(intervals over seeds excluding zero): the fine-tuned average is "
        f"{lower_higher(over, len(over))} of the {len(over)} configurations"
        + (f"; per task, the runs scored below the checkpoint on {worse}" if worse else "")
        + f" (untrained: {untrained}; the checkpoint note above says what it was trained on). The "
        "seeds measure other training runs on the same dev examples; with the tables' seed "
        f"{seed} alone, on its dev intervals, the average is {lower_higher(deltas, len(runs))}."
    )


def findings_section(
    runs: dict[str, dict],
    zero_shot: dict | None,
    evidence: Evidence,
    seed_study: SeedRuns | None,
    compared: list[Compared],
    missed_controls: list[str],
    controls_checked: int,
    starts: Starts,
    paper_best: tuple[str, float] | None,
    paper_setting: str,
) -> list[str]:
    """One paragraph of findings, then the table behind its first claim; ``paper_setting``:
    the paper's setting in a few words (paper.yaml's ``setup.summary``)."""
    if not runs:
        return ["No multitask configuration has been run (stage `multitask`): nothing to report yet."]
    said = []
    checkpoint = usual({n: f"`{m.checkpoint.name}`" for n, m in runs.items()})
    scale = usual({n: f"`{m.scale}`" for n, m in runs.items()})
    said.append(
        f"These runs fine-tune {checkpoint} on {training_budget(runs)} (scale {scale}; the "
        f"paper: {paper_setting}), so they show how the methods behave at this budget, not "
        "the paper's effect sizes."
    )
    table = []
    if zero_shot is not None:
        deltas, over, seed = against_untrained(runs, zero_shot, evidence), starts.over_seeds, starts.seed
        said.append(untrained_sentence(runs, zero_shot, deltas, over, seed_study, seed))
        table = [
            "",
            "Each configuration minus the untrained checkpoint on the same dev examples, with the "
            f"tables' seed {seed} ({level()} paired-bootstrap "
            "intervals; below zero: the fine-tuned run scored less than the untrained checkpoint, "
            "which is not where it started: controls.md separates what its heads on the frozen "
            "encoder start with from what fine-tuning changed)"
            + (
                ", and its average minus the checkpoint's with the same seed, over the seeds both "
                f"ran with ({level()} interval over seeds)"
                if over
                else ""
            )
            + ":",
            "",
            *md_header(
                ["Configuration", *(f"Δ {COLUMN_TITLES[c]}" for c in COLUMNS)]
                + ([f"Δ {COLUMN_TITLES[AVERAGE]} over seeds"] if over else [])
            ),
            *(
                md_row(
                    [f"`{n}`", *(fmt_signed(d[c]) for c in COLUMNS)]
                    + ([fmt_signed(over[n][AVERAGE]) if n in over else NO_NUMBER] if over else [])
                )
                for n, d in deltas.items()
            ),
        ]
    said.append(highest(runs, evidence, zero_shot))
    shown = [c for c in compared if c.verdict() == SHOWN]
    unequal = [c for c in compared if c.verdict() == BUDGETS_DIFFER]
    said.append(
        f"Of the {len(compared)} comparisons of Tables 2-4, the average differs from the parent's "
        f"as shown (bold) in {len(shown)}"
        + (f" ({', '.join(f'`{c.name}` vs `{c.parent}`' for c in shown)})" if shown else "")
        + f" and with other budgets (‡) in {len(unequal)}"
        + (f" ({', '.join(f'`{c.name}` vs `{c.parent}`' for c in unequal)})" if unequal else "")
        + "; the first page's Summary (README.md) gives each comparison's verdict and what its "
        "seeds rule out."
    )
    if starts.own:
        said.append(
            "Every configuration and column against where it started (paired intervals; controls.md, "
            f'"Against where each run started"): {starts.counted()}.'
        )
    if controls_checked:
        verb = "is" if len(missed_controls) == 1 else "are"
        said.append(
            f"{len(missed_controls)} of {controls_checked} control checks {verb} not met "
            f"({'; '.join(missed_controls)}): those cells measure a head no better than a constant answer."
            if missed_controls
            else f"All {controls_checked} control checks are met (controls.md lists the cells, with the "
            "tables' seed): none of those cells measures a head no better than a constant answer."
        )
    if paper_best is not None and paper_best[0] in runs:
        config, value = paper_best
        means = seed_study.means(config) if seed_study else None
        ours = f"{runs[config].scores[AVERAGE]:.3f} here (the tables' seed)"
        if means is not None:
            count = len(seed_study.configs[config])
            ours = f"{means[AVERAGE]:.3f} here (the mean over its {count} seeds, as in Table 2)"
        said.append(
            f"For scale: the paper's best model averages {value:.3f} on its dev sets; "
            f"`{config}` averages {ours}."
        )
    return [" ".join(said), *table] if said else [NO_NUMBER]


def ranked(runs: dict[str, dict]) -> list[tuple[str, float]]:
    """The configurations by their chance-corrected dev score (``dev_selection``), highest
    first (the plain average can rank a constant answer high)."""
    return sorted(((n, m.dev_selection[SELECTION]) for n, m in runs.items()), key=lambda r: -r[1])


def highest(runs: dict[str, dict], evidence: Evidence, zero_shot: dict | None = None) -> str:
    """The configuration highest on the chance-corrected dev score (``ranked``), how far
    the next is, and how far the untrained checkpoint (``zero_shot``'s run), which the
    ranking leaves out."""
    score = dict(ranked(runs))  # highest first
    top, *others = score
    top_scored = multitask_scored(evidence, "multitask", top, runs[top])
    sentence = (
        f"Ranked on dev by the chance-corrected score that chose the epochs on validation "
        f"({SELECTION_MEAN}; a constant answer scores 0), the highest fine-tuned configuration is "
        f"`{top}`'s {score[top]:.3f}"
    )
    if others:
        second = others[0]
        gap = budget_gap(runs[top], runs[second])
        iv = evidence.selection_difference(
            top_scored, multitask_scored(evidence, "multitask", second, runs[second])
        )
        separated = "separated from" if iv.excludes_zero else "not separated from"
        sentence += (
            f", {separated} the next, `{second}`'s {score[second]:.3f} (Δ {fmt_signed(iv)}"
            + (f"; the two ran at other budgets: {gap}" if gap else "")
            + ")"
        )
    if zero_shot is not None:
        untrained = multitask_scored(evidence, "zero-shot", "", zero_shot)
        sentence += (
            f"; `{top}` minus the untrained checkpoint, on the same score: Δ "
            f"{fmt_signed(evidence.selection_difference(top_scored, untrained))}"
        )
    return (
        f"{sentence}. These dev scores are the tables' seed {runs[top].seed}'s alone: the seed study "
        "records the tables' metrics, not these."
    )
