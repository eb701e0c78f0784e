"""The learning-rate search by family (``minbert lr-search``) on the choices page: each
searched family's grid of mean validation scores over the seeds, its choice, and where the
tables' runs stand against it (docs/experiments.md, "The rate search")."""

from __future__ import annotations

from minbert.report.formatting import NO_NUMBER, md_header, md_row
from minbert.report.studies import searched_at
from minbert.runs.study_files import FamilyChoice, FamilySearchFile
from minbert.runs.training import MultitaskRunFile

# The example counts a run's record states as its seed realized them: whole question
# groups make them differ from seed to seed by a few rows at the same parameters (and a
# search run counts only with the committed parameters but its seed and rate).
REALIZED = ("train_examples", "validation_examples")


def _signed(triple: list[float] | None) -> str:
    if triple is None:
        return NO_NUMBER
    mean, low, high = triple
    mark = " §" if low > 0 or high < 0 else ""  # not the tables' ‡ (budgets differ)
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]{mark}"


def _runs_against(choice: FamilyChoice, members: list[MultitaskRunFile]) -> str:
    """The tables' runs of the family with this optimizer: their rate, and the chosen
    rate's paired difference from it where it is on the grid."""
    if not members:
        return "none at this scale"
    names = ", ".join(f"`{m.config}`" for m in members)
    used = sorted({m.settings.lr for m in members})
    said = []
    for lr in used:
        if lr == choice.lr:
            said.append(f"lr {lr:g}, the chosen rate")
            continue
        on_grid = next((g for g in choice.grid if g.lr == lr), None)
        against = f"chosen − it {_signed(on_grid.chosen_minus)}" if on_grid else "not on the grid"
        said.append(f"lr {lr:g} ({against})")
    return f"{names}: {'; '.join(said)}"


def family_search_section(study: FamilySearchFile | None, runs: dict[str, MultitaskRunFile]) -> list[str]:
    """The section from the search's file (``study``); none without one."""
    if study is None:
        return []
    grid = sorted({p.lr for p in study.points})
    seeds = sorted({p.seed for p in study.points})
    lines = [
        "### Learning rates by family",
        "",
        f"`metrics/lr-search.json` (`{study.command}`): for each family and optimizer, "
        "its first configuration trained at every rate with seeds "
        f"{', '.join(map(str, seeds))} (apart from the tables' seed and the seed study's), one DVC "
        "experiment each, scored by its kept epoch's validation selection score (dev chooses "
        "nothing). A cell: the rate's mean over the seeds; the chosen rate (the highest mean) "
        "**bold** with its interval over the seeds, and beside every other rate the chosen "
        "rate's paired difference from it (§: the interval excludes 0). The runs take a "
        "family's rates once they are written to `scales.<scale>.multitask.rates` (params.yaml) "
        "and the study is rerun; until then, the last column says where they stand. Searched at: "
        "the settings each run records against the tables' run's, the example counts each seed "
        "realizes apart (whole question groups; a run counts only with the committed parameters "
        "but its seed and rate).",
        "",
        *md_header(
            [
                "Scale",
                "Family",
                "Optimizer",
                "Searched on",
                *(f"lr {lr:g}" for lr in grid),
                "Searched at",
                "The tables' runs",
            ]
        ),
    ]
    for choice in study.chosen:
        points = [
            p
            for p in study.points
            if (p.scale, p.family, p.optimizer) == (choice.scale, choice.family, choice.optimizer)
        ]
        by_lr = {g.lr: g for g in choice.grid}
        cells = []
        for lr in grid:
            g = by_lr.get(lr)
            if g is None:
                cells.append(NO_NUMBER)
            elif lr == choice.lr:
                low, high = choice.interval[1:] if choice.interval else (None, None)
                spread = f" [{low:.3f}, {high:.3f}]" if low is not None else ""
                cells.append(f"**{g.mean:.3f}**{spread}")
            else:
                cells.append(f"{g.mean:.3f} ({_signed(g.chosen_minus)})")
        config = points[0].config
        members = [
            runs[c]
            for c in choice.members
            if c in runs and runs[c].settings.optimizer == choice.optimizer and runs[c].scale == choice.scale
        ]
        run = runs.get(config) if config in runs and runs[config].scale == choice.scale else None
        row = [f"`{choice.scale}`", choice.family, choice.optimizer, f"`{config}`", *cells]
        slack = run.data_split.quora.values["largest_group_pairs"] if run is not None else 0
        searched = searched_at(points, run, realized=REALIZED, slack=slack)
        lines.append(md_row([*row, searched, _runs_against(choice, members)]))
    return lines
