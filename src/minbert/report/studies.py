"""The report's sections beyond the paper's tables: what chose each run's epoch and
learning rates (and what those chance-corrected scores are on dev), and the seed study
(MLM pretraining's section: ``minbert.report.pretraining``)."""

from __future__ import annotations

import statistics

from minbert.report.comparisons import (
    MIN_SEEDS,
    POWER,
    Compared,
    SeedRuns,
    level,
    ran_at,
    seed_detectable,
    seed_differences,
    seed_interval,
)
from minbert.report.formatting import (
    COLUMN_TITLES,
    COLUMNS,
    NO_NUMBER,
    SELECTION_COLUMNS,
    SELECTION_MEAN,
    fmt,
    fmt_signed,
    md_header,
    md_row,
    per_task,
)
from minbert.report.notes import planned_rates, rates, selection_note, usual
from minbert.runs.study_files import LrSearchFile, SearchChoice, SearchPoint
from minbert.tasks import AVERAGE, SELECTION


def selection_section(
    runs: dict[str, dict],
    sentiment: list[dict],
    params: dict | None,
    lr_search: LrSearchFile | None,
    sources: dict[str, str],
) -> str:
    """What chose each run's epoch and rates, and the multitask runs' chance-corrected dev
    scores, per scale (``params``: the scales not run; ``sources``: what chose the rates)."""
    if not runs:
        return "No multitask configuration has been run (stage `multitask`)."
    ran = list(dict.fromkeys(m.scale for m in runs.values()))
    scales = list(dict.fromkeys([*(params["scales"] if params else []), *ran]))
    lines = [selection_note(runs, "multitask run")]
    if sentiment:
        lines += ["", selection_note({m.run: m for m in sentiment}, "sentiment run (Table 1)")]
    lines += [
        "",
        "The tables keep the paper's metrics (accuracy, Pearson's r and their average); the "
        "epochs and the learning rates were chosen by the chance-corrected ones, on which a "
        "constant answer scores 0 however common that answer is. The multitask runs' "
        "chance-corrected scores on the full dev sets, with the chosen epoch (each record's "
        "`dev_selection`; Mean: what chose the epoch, there on the validation split):",
        "",
        *md_header(["Configuration", *SELECTION_COLUMNS.values(), "Mean"]),
        *(
            md_row(
                [
                    f"`{name}`",
                    *(fmt(m.dev_selection[k]) for k in SELECTION_COLUMNS),
                    fmt(m.dev_selection[SELECTION]),
                ]
            )
            for name, m in runs.items()
        ),
        "",
        *md_header(["Scale", "Validation split, examples per task", "Learning rates", "Chosen by"]),
    ]
    for scale in scales:
        if scale in ran:
            mine = {c: m for c, m in runs.items() if m.scale == scale}
            validation = usual({c: per_task(m.validation_examples) for c, m in mine.items()})
            by_optimizer: dict[str, dict[str, str]] = {}
            for c, m in mine.items():
                by_optimizer.setdefault(m.settings.optimizer, {})[c] = rates(m.settings)
            learning_rates = "; ".join(usual(v) for v in by_optimizer.values())
            label = f"`{scale}` (the runs above)"
        else:
            sized = params["scales"][scale]["multitask"]
            validation = (
                per_task(sized["validation_examples"]) if "validation_examples" in sized else NO_NUMBER
            )
            learning_rates = "; ".join(
                planned_rates(name, spec) for name, spec in sized["optimizers"].items()
            )
            label = f"`{scale}` (params.yaml)"
        chosen_by = search_summary(lr_search, runs, scale) if scale in ran else None
        chosen_by = chosen_by or sources.get(scale, "not stated (reference/paper.yaml `learning_rates`)")
        lines.append(md_row([label, validation, learning_rates, chosen_by.strip()]))
    dev_slice = usual({c: per_task(m.history_examples["dev"]) for c, m in runs.items()})
    lines += [
        "",
        "Dev is scored once per configuration, with the chosen epoch, for the tables, and "
        "chooses nothing; the dev "
        f"slice scored after every epoch (the history's `dev_*` columns: {dev_slice}) is drawn "
        "in the figures only.",
        "",
        *lr_search_section(lr_search, runs),
    ]
    return "\n".join(lines)


# What a search point varies, or trains without (minbert.tools.lr_search): left out of the
# settings it records (`ran_at`, as a run's record states them), and of their comparison
# with the runs it chose for.
SEARCH_VARIES = ("lr", "head_lr", "test_predictions")


def search_summary(study: LrSearchFile | None, runs: dict[str, dict], scale: str) -> str | None:
    """What chose the rates of the runs at ``scale``, from the search's own file: which
    configuration each optimizer's rates were searched on, and at which settings; None
    without a search at that scale."""
    if study is None:
        return None
    points: dict[tuple[str, str], list[SearchPoint]] = {}
    for p in study.runs:
        if p.scale == scale:
            points.setdefault((p.optimizer, p.config), []).append(p)
    if not points:
        return None
    said = "; ".join(
        f"{optimizer}'s on `{config}`, at {searched_at(found, runs.get(config))}"
        for (optimizer, config), found in sorted(points.items())
    )
    return f"`minbert lr-search` on the validation split, never dev (`metrics/lr-search.json`): {said}"


def searched_at(
    points: list[SearchPoint], run: dict | None, realized: tuple[str, ...] = (), slack: int = 0
) -> str:
    """Whether a configuration's search points ran at the settings of the tables' run of
    it (``ran_at``, the rates aside; ``realized``: per-task counts a seed realizes, the
    same when within ``slack`` of the run's): the same, those that differ (searched, then
    run), or not recorded."""
    if run is None:
        return NO_NUMBER
    recorded = [p.ran_at for p in points]
    if any(r is None for r in recorded):
        return "settings not recorded (the file names its scale alone)"
    # Every setting the run's record states (a point also records some it does not: the
    # history's slices, the seed, which the search file states apart).
    ours = {k: v for k, v in ran_at(run).items() if k not in SEARCH_VARIES}
    differ = {}
    for r in recorded:
        differ |= {
            k: r.get(k)
            for k in sorted(ours)
            if not (_within(r.get(k), ours[k], slack) if k in realized else r.get(k) == ours[k])
        }
    if not differ:
        return "the settings of the tables' run"
    said = "; ".join(f"{k} {_short(v)} (the run: {_short(ours.get(k))})" for k, v in differ.items())
    return f"other settings: {said}"


def _within(counts: dict | None, ours: dict, slack: int) -> bool:
    return (
        counts is not None
        and counts.keys() == ours.keys()
        and all(abs(counts[t] - ours[t]) <= slack for t in ours)
    )


def _short(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_short(v)}" for k, v in value.items())
    return f"{value:g}" if isinstance(value, float) else str(value)


def lr_search_section(study: LrSearchFile | None, runs: dict[str, dict]) -> list[str]:
    """The learning-rate search (``metrics/lr-search.json``): per configuration, every
    grid point's score, its chosen point in bold, and whether the tables' run used it."""
    if study is None:
        return [
            "No learning-rate search has been committed (`metrics/lr-search.json`); run "
            "`minbert lr-search` (docs/parameters.md, Learning rates)."
        ]
    grid = sorted({(p.lr, p.head_lr) for p in study.runs})
    searched: dict[tuple, dict] = {}
    for p in study.runs:
        searched.setdefault((p.scale, p.config, p.optimizer), {})[p.lr, p.head_lr] = p
    lines = [
        f"Learning-rate search (`metrics/lr-search.json`, `{study.command}`): each searched "
        "configuration is trained at its scale at every point of one grid (encoder lr, heads' "
        "lr) without scoring dev; a point scores the validation selection score of its best "
        f"epoch ({SELECTION_MEAN}, as the epochs are chosen); each searched configuration's best "
        "point is **bold** (a tie keeps the smaller rates). Searched at: whether its points ran "
        "at the settings of the tables' run of it (the rates and seed apart), from the settings "
        "each point records; a choice made at other settings may not be the best at these.",
        "",
        *md_header(
            [
                "Scale",
                "Configuration",
                "Optimizer",
                *(f"lr {lr:g}, heads {head:g}" for lr, head in grid),
                "optimizer steps",
                "The tables' run",
                "Searched at",
            ]
        ),
    ]
    for (scale, config, optimizer), points in sorted(searched.items()):
        best = study.chosen.get(f"{scale}/{config}/{optimizer}")
        cells = []
        for point in grid:
            text = f"{points[point].score:.3f}" if point in points else NO_NUMBER
            cells.append(f"**{text}**" if best and (best.lr, best.head_lr) == point else text)
        steps = ", ".join(dict.fromkeys(f"{p.optimizer_steps:,}" for p in points.values()))
        run = runs[config] if config in runs and runs[config].scale == scale else None
        row = [f"`{scale}`", f"`{config}`", optimizer, *cells, steps, _used(runs.get(config), scale, best)]
        lines.append(md_row([*row, searched_at(list(points.values()), run)]))
    unsearched = [f"`{n}`" for n, m in runs.items() if (m.scale, n, m.settings.optimizer) not in searched]
    shared = _optimizer_rates(runs, study)
    if shared:
        lines += ["", shared]
    if unsearched:
        lines += ["", f"Not in the search: {', '.join(unsearched)} (their rates: params.yaml)."]
    return lines


def _optimizer_rates(runs: dict[str, dict], study: LrSearchFile) -> str:
    """A line naming each optimizer's chosen rates (each searched on one configuration) and
    whether every run uses its optimizer's; '' when an optimizer's choice is not unique."""
    chosen: dict[tuple[str, str], SearchChoice] = {}
    for point in study.chosen.values():
        key = (point.scale, point.optimizer)
        if key in chosen:
            return ""
        chosen[key] = point
    used = {n: chosen.get((m.scale, m.settings.optimizer)) for n, m in runs.items()}
    if not any(used.values()):
        return ""
    choices = "; ".join(
        f"{optimizer} at `{scale}`: lr {c.lr:g}, heads {c.head_lr:g} (searched on `{c.config}`)"
        for (scale, optimizer), c in sorted(chosen.items())
    )
    others = [
        f"`{n}` ({rates(runs[n].settings)})"
        for n, c in used.items()
        if c is None or (runs[n].settings.lr, runs[n].settings.head_lr) != (c.lr, c.head_lr)
    ]
    return f"Each optimizer's chosen rates: {choices}. " + (
        "Every row runs at its optimizer's."
        if not others
        else f"Not at its optimizer's: {', '.join(others)}."
    )


def _used(run: dict | None, scale: str, best: SearchChoice | None) -> str:
    """Whether the tables' run of a searched configuration used the search's choice."""
    if run is None or run.scale != scale:
        return f"not run at `{scale}`"
    if best is None:
        return NO_NUMBER
    s = run.settings
    if (s.optimizer, s.lr, s.head_lr) == (best.optimizer, best.lr, best.head_lr):
        return "the chosen rates"
    return f"not the chosen rates: {rates(s)}"


def seed_section(
    study: SeedRuns | None,
    parents: dict[str, str],
    runs: dict[str, dict],
    compared: list[Compared] | None = None,
) -> str:
    """The seed study with the tables' own seed: mean ± sd per cell, and each configuration
    minus its ablation parent seed by seed, with the paired interval over seeds; each
    comparison's verdict is its record's (``compared``: the tables')."""
    judged = {(c.name, c.parent): c for c in compared or []}
    if study is None:
        return (
            "No seed study has been committed (`metrics/seed-study.json`). Run it with "
            "`minbert seed-study` (docs/experiments.md, The seed study)."
        )
    configs = study.configs
    own = usual({n: str(m.seed) for n, m in runs.items()})
    lines = [
        f"Each configuration trained with seeds {', '.join(map(str, study.seeds))} (the seed "
        f"study) and with the tables' own seed {own}, read from the current metrics files; the "
        "seed changes the heads' initialisation, the dropout masks, the training subsets "
        "and the batch order, and every cell is the mean ± sample standard deviation over the "
        f"seeds on the full dev sets. Regenerate the study with `{study.study.command}` "
        f"({study.study.how}).",
        "",
    ]
    if study.other_settings:
        lines += [
            "Left out: the extra seeds of "
            + ", ".join(f"`{c}`" for c in study.other_settings)
            + ", whose runs had other settings than the tables' run (the study records each "
            "configuration's): their rows below hold the tables' own seed alone, and no verdict "
            "rests on those seeds.",
            "",
        ]
    if study.settings_unrecorded:
        lines += [
            "Not checked against the tables' runs (the study does not record their settings): "
            + ", ".join(f"`{c}`" for c in study.settings_unrecorded)
            + ".",
            "",
        ]
    lines += md_header(
        [
            "Configuration",
            *(COLUMN_TITLES[c] for c in COLUMNS),
            "seeds",
            "Average − parent, per seed",
            f"{level()} interval over seeds",
            f"detectable ({POWER:.0%} power)",
        ]
    )
    verdicts = []
    for config, rows in configs.items():
        cells = [f"`{config}`"]
        for c in COLUMNS:
            values = [r.scores[c] for r in rows]
            cells.append(
                f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"
                if len(values) > 1
                else f"{values[0]:.3f}"
            )
        cells.append(", ".join(str(r.seed) for r in rows))
        parent = parents.get(config)
        diffs = seed_differences(study, config, parent)[AVERAGE] if parent in configs else []
        if diffs:
            iv, detectable = seed_interval(diffs), seed_detectable(diffs)
            per_seed = ", ".join(f"{d:+.3f}" for d in diffs)
            cells += [f"vs `{parent}`: {per_seed}", fmt_signed(iv) if iv else NO_NUMBER]
            cells.append(NO_NUMBER if detectable is None else f"{detectable:.3f}")
            record = judged.get((config, parent))
            if record is not None:
                verdicts.append(record.sentence([AVERAGE]))
        else:
            cells += [NO_NUMBER, NO_NUMBER, NO_NUMBER]
        lines.append(md_row(cells))
    lines += [
        "",
        "Average − parent: the configuration's average minus that of the configuration it "
        "ablates (as in the tables above), trained with the same seed, one number per seed "
        "in the order of the seeds column. Interval over seeds: their mean ± t · sd / √n "
        f"(Student's t, n − 1 degrees of freedom), from at least {MIN_SEEDS} seeds. It measures "
        "what another training run would change, on the same dev examples, where the tables' "
        "bootstrap measures what other dev examples would change, for one training run: the "
        "tables show a difference (bold) only when both exclude zero, column by column, and the "
        "seeds' test holds after Holm's adjustment within its family. Detectable: the smallest "
        f"mean difference these seeds would tell from zero {POWER:.0%} of the time, (t + t_power) "
        "· sd / √n: a planning figure for the next study, not a verdict. Each comparison's "
        "verdict below is the tables' own.",
    ]
    if verdicts:
        lines += ["", *verdicts]
    return "\n".join(lines)


def choice_seeds(choices: dict[str, set[int]]) -> dict[str, int]:
    """Each committed choice's file (``choices``: its path and the seeds it ran with) and
    its seed, where it ran with one."""
    return {name: next(iter(seeds)) for name, seeds in choices.items() if len(seeds) == 1}
