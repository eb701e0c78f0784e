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
    fmt,
    fmt_bound,
    fmt_setting,
    fmt_signed,
    md_header,
    md_row,
    per_task,
)
from minbert.report.notes import planned_rates, rates, selection_note, usual
from minbert.runs.study_files import FamilyPoint, FamilySearchFile, SeedStudyFile
from minbert.tasks import AVERAGE, SELECTION


def selection_section(
    runs: dict[str, dict],
    sentiment: list[dict],
    params: dict | None,
    lr_search: FamilySearchFile | None,
    sources: dict[str, str],
) -> str:
    """What chose each run's epoch and rates, and the multitask runs' chance-corrected dev
    scores, per scale (``params``: the scales not run; ``lr_search``: the search by family;
    ``sources``: what chose the rates where nothing searched them)."""
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
        "Dev is scored twice per configuration, at its start (epoch 0, for the controls) and "
        "at the chosen epoch (for the tables), and chooses nothing; the dev "
        f"slice scored after every epoch (the history's `dev_*` columns: {dev_slice}) is drawn "
        "in the figures only.",
    ]
    return "\n".join(lines)


# What a search point varies, or trains without (minbert.tools.lr_search): left out of the
# settings it records (`ran_at`, as a run's record states them), and of their comparison
# with the runs it chose for.
SEARCH_VARIES = ("lr", "head_lr", "test_predictions")


def search_summary(study: FamilySearchFile | None, runs: dict[str, dict], scale: str) -> str | None:
    """What chose the rates of the runs at ``scale``: the family search's choices, each
    with the configuration it was searched on, and the runs no choice covers; None
    without a search at that scale."""
    if study is None:
        return None
    mine = [c for c in study.chosen if c.scale == scale]
    if not mine:
        return None
    on = {(p.family, p.optimizer): p.config for p in study.points if p.scale == scale}
    seeds = ", ".join(map(str, sorted({p.seed for p in study.points if p.scale == scale})))
    said = "; ".join(
        f"{c.family}'s {c.optimizer} on `{on[c.family, c.optimizer]}` (lr {c.lr:g})" for c in mine
    )
    covered = {m for c in mine for m in c.members}
    left = [f"`{n}`" for n, m in runs.items() if m.scale == scale and n not in covered]
    unsearched = f"; not searched: {', '.join(left)} (params.yaml)" if left else ""
    return (
        f"`minbert lr-search FAMILY` on the validation split over seeds {seeds}, never dev "
        f"(`metrics/lr-search.json`; the grids: Learning rates by family, below): {said}{unsearched}"
    )


def searched_at(
    points: list[FamilyPoint], run: dict | None, realized: tuple[str, ...] = (), slack: int = 0
) -> str:
    """The settings the search points ran at against the tables' run's (the rates aside;
    ``realized``: per-task counts, the same within ``slack``): the same, or what differs."""
    if run is None:
        return NO_NUMBER
    recorded = [p.ran_at for p in points]
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
    said = "; ".join(f"{k} {fmt_setting(v)} (the run: {fmt_setting(ours.get(k))})" for k, v in differ.items())
    return f"other settings: {said}"


def _within(counts: dict | None, ours: dict, slack: int) -> bool:
    return (
        counts is not None
        and counts.keys() == ours.keys()
        and all(abs(counts[t] - ours[t]) <= slack for t in ours)
    )


def _made_where(study: SeedStudyFile) -> str:
    """Where each seed's runs were made: the commits whose code they ran and the devices,
    as the study records them (older studies did not)."""
    made: dict[int, set[tuple[str, str]]] = {}
    for rows in study.configs.values():
        for r in rows:
            made.setdefault(r.seed, set()).add((r.code, r.device))
    recorded = {seed: where for seed, where in sorted(made.items()) if all(c and d for c, d in where)}
    missing = [str(seed) for seed in sorted(made) if seed not in recorded]
    said = [
        f"seed {seed} at commit {' / '.join(sorted(c for c, _ in where))} on "
        f"{' / '.join(sorted(d for _, d in where))}"
        for seed, where in recorded.items()
    ]
    if missing:
        said.append(
            f"not recorded for seed{'s' * (len(missing) > 1)} {', '.join(missing)} (the study was "
            "written before it recorded them; the git log of `metrics/seed-study.json` dates each "
            "seed's rows)"
        )
    return "Where the seeds' runs were made (the code's commit, the device): " + "; ".join(said) + "."


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
        _made_where(study.study),
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
            per_seed = ", ".join(fmt_bound(d) for d in diffs)
            cells += [f"vs `{parent}`: {per_seed}", fmt_signed(iv) if iv else NO_NUMBER]
            cells.append(NO_NUMBER if detectable is None else f"{detectable:.3f}")
            record = judged.get((config, parent))
            if record is not None:
                verdicts.append(record.sentence([AVERAGE]))
        else:
            cells += [NO_NUMBER, NO_NUMBER, NO_NUMBER]
        lines.append(md_row(cells))
    untrained = [f"`{c}`" for c in configs if c not in runs]  # the untrained checkpoint: no training
    lines += [
        "",
        *(
            [
                f"{', '.join(untrained)}: the untrained checkpoint, its SST probe and Quora threshold "
                "fitted on each seed's training rows (the findings compare each configuration with it "
                "seed by seed).",
                "",
            ]
            if untrained
            else []
        ),
        "Average − parent: the configuration's average minus that of the configuration it "
        "ablates (as in the tables above), trained with the same seed, one number per seed "
        "in the order of the seeds column. Interval over seeds: their mean ± t · sd / √n "
        f"(Student's t, n − 1 degrees of freedom), from at least {MIN_SEEDS} seeds. It measures "
        "what another training run would change, on the same dev examples, where the tables' "
        "bootstrap measures what other dev examples would change, for one training run: the "
        "tables show a difference (bold) only when both exclude zero on the same side, column by "
        "column, the seeds' test holds after Holm's adjustment within its family, and both rows "
        "had the same training budget (the tables' note gives every mark). Detectable: the smallest "
        f"mean difference these seeds would tell from zero {POWER:.0%} of the time, (t + t_power) "
        "· sd / √n: a planning figure for the next study, not a verdict. Each comparison's "
        "verdict below is the tables' own.",
    ]
    if verdicts:
        lines += ["", *verdicts]
    return "\n".join(lines)


def result_seeds(results: dict[str, dict | None]) -> dict[str, set[int]]:
    """Each benchmark result's seed (``results``: its path and content, None when absent)."""
    missing = [path for path, result in results.items() if result is None]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)}: no such benchmark result (dvc.yaml's report cmd)")
    return {path: {result["args"]["seed"]} for path, result in results.items()}


def choice_seeds(choices: dict[str, set[int]]) -> dict[str, int]:
    """Each committed choice's file (``choices``: its path and the seeds it ran with) and
    its seed, where it ran with one."""
    return {name: next(iter(seeds)) for name, seeds in choices.items() if len(seeds) == 1}
