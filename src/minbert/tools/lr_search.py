"""``minbert lr-search FAMILY``: a learning-rate family's rates searched over seeds at the
committed settings, through DVC's experiment queue, chosen on validation
(docs/experiments.md, "The rate search")."""

from __future__ import annotations

import io
import statistics
import subprocess
from pathlib import Path

import pandas as pd

from minbert.commits import git
from minbert.cores import side_by_side
from minbert.pipeline.params import load
from minbert.pipeline.schema import config_values
from minbert.report.comparisons import ran_at, seed_interval
from minbert.report.studies import SEARCH_VARIES
from minbert.results import HISTORY, history_column
from minbert.runs.study_files import (
    FamilyChoice,
    FamilyPoint,
    FamilySearchFile,
    RateMean,
    read_family_search,
    write_family_search,
)
from minbert.runs.training import MultitaskRunFile
from minbert.tasks import SELECTION
from minbert.tools.sweep import (
    DVC,
    Run,
    collect_runs,
    current_lock,
    flatten_params,
    same_code,
    wait_for_queue,
)

COMMAND = "minbert lr-search"
# Parameters a search run may differ in from the commit it ran on, besides its family's
# rates: the seed, and those no multitask stage reads.
VARIES = ("seed", "lr_search.", "seed_study.", "mlm.", "repro_configs")


def searched_configs(params: dict, family: str) -> dict[str, str]:
    """Per optimizer of ``family``, its first configuration (params.yaml's order)."""
    members = family_members(params)
    found = {optimizer: configs[0] for (name, optimizer), configs in members.items() if name == family}
    if not found:
        families = sorted({name for name, _ in members})
        raise ValueError(f"no configuration has rate_family {family!r}; the families: {families}")
    return found


def family_members(params: dict) -> dict[tuple[str, str], list[str]]:
    """Each (family, optimizer)'s configurations, in params.yaml's order."""
    found: dict[tuple[str, str], list[str]] = {}
    for config in params["configs"]:
        values = config_values(params, config)
        found.setdefault((values["rate_family"], values["optimizer"]), []).append(config)
    return found


def _rate_key(params: dict, family: str, optimizer: str) -> str:
    return f"scales.{params['scale']}.multitask.rates.{family}.{optimizer}.lr"


def queue_search(repo: Path, family: str) -> list[list[str]]:
    """Queue, run and wait for every run of ``family``'s grids; the commands queued."""
    params = load(repo / "params.yaml")
    search = params["lr_search"]
    commands = [
        [
            *DVC,
            "exp",
            "run",
            "--queue",
            "-S",
            f"seed={seed}",
            "-S",
            f"++{_rate_key(params, family, opt)}={lr}",
        ]
        # Its stage exists where `dvc repro` leaves the configuration out, too.
        + ([] if config in params["repro_configs"] else ["-S", f"repro_configs=[{config}]"])
        + [f"multitask@{config}"]
        for opt, config in searched_configs(params, family).items()
        for lr in search["lrs"][opt]
        for seed in search["seeds"]
    ]
    for command in commands:
        subprocess.run(command, cwd=repo, check=True)
    jobs = search["jobs"]
    subprocess.run(
        [*DVC, "queue", "start", "--jobs", str(jobs)], cwd=repo, check=True, env=side_by_side(jobs)
    )
    wait_for_queue(repo)
    return commands


def _apart(params: dict) -> dict:
    """``params`` less what a search run may change (VARIES and its family's rates) and the
    other families' rates, which none of its configurations reads: a family's choice
    written to params.yaml leaves the other families' points standing."""
    rates = f"scales.{params['scale']}.multitask.rates."
    return {k: v for k, v in flatten_params(params).items() if not k.startswith((*VARIES, rates))}


def _validation(repo: Path, run: Run, config: str, kept: int) -> list[float]:
    """The run's validation selection score per epoch, from its history at its commit."""
    text = git(repo, "show", f"{run.rev}:metrics/multitask/{config}{HISTORY}")
    history = pd.read_csv(io.StringIO(text)).set_index("epoch")
    scores = [float(v) for v in history[history_column("val", SELECTION)]]
    if not 0 <= kept < len(scores):
        raise ValueError(f"{run.name}: kept epoch {kept} is not in {config}'s history")
    return scores


def search_points(repo: Path, runs: list[Run], params: dict, family: str, lock: dict) -> list[FamilyPoint]:
    """``family``'s finished search runs: the committed parameters but the seed and the
    family's rate, and the stage's current code (``lock``: dvc.lock's stages)."""
    committed = _apart(params)
    # A search run sets the family's rate itself, with one of the search's seeds.
    searched = [
        (run, flatten_params(run.params))
        for run in runs
        if _apart(run.params) == committed and run.params["seed"] in params["lr_search"]["seeds"]
    ]
    points = []
    for optimizer, config in searched_configs(params, family).items():
        for run, flat in searched:
            if _rate_key(params, family, optimizer) not in flat:
                continue
            m = run.metrics.get(f"multitask/{config}")
            if not isinstance(m, MultitaskRunFile) or m.settings.optimizer != optimizer:
                continue
            if m.seed != run.params["seed"] or not same_code(run, lock, f"multitask@{config}"):
                continue
            per_epoch = _validation(repo, run, config, m.epoch)
            points.append(
                FamilyPoint(
                    scale=m.scale,
                    family=family,
                    config=config,
                    optimizer=optimizer,
                    lr=m.settings.lr,
                    head_lr=m.settings.head_lr,
                    seed=m.seed,
                    experiment=run.name,
                    best_epoch=m.epoch,
                    validation_selection=per_epoch[m.epoch],
                    validation_per_epoch=per_epoch,
                    ran_at={k: v for k, v in ran_at(m).items() if k not in SEARCH_VARIES},
                )
            )
    return sorted(points, key=lambda p: (p.optimizer, p.lr, p.seed))


def _triple(interval) -> list[float] | None:
    return None if interval is None else [interval.value, interval.low, interval.high]


def choose(points: list[FamilyPoint], members: dict[tuple[str, str], list[str]]) -> list[FamilyChoice]:
    """Per scale, family and optimizer: the highest mean over the seeds (a tie keeps the
    smaller rate), with its interval and its paired differences from the other rates."""
    groups: dict[tuple, dict[float, dict[int, float]]] = {}
    for p in points:
        by_lr = groups.setdefault((p.scale, p.family, p.optimizer), {})
        by_lr.setdefault(p.lr, {})[p.seed] = p.validation_selection
    chosen = []
    for (scale, family, optimizer), by_lr in sorted(groups.items()):
        means = {lr: statistics.mean(scores.values()) for lr, scores in sorted(by_lr.items())}
        best = max(means, key=lambda lr: means[lr])  # the first (smallest) of equal means
        mine = by_lr[best]
        grid = []
        for lr, scores in by_lr.items():
            shared = sorted(set(scores) & set(mine))
            minus = None if lr == best else _triple(seed_interval([mine[s] - scores[s] for s in shared]))
            grid.append(RateMean(lr, sorted(scores), means[lr], minus))
        interval = _triple(seed_interval(list(mine.values())))
        grid = sorted(grid, key=lambda g: g.lr)
        chosen.append(
            FamilyChoice(scale, family, optimizer, best, interval, grid, members.get((family, optimizer), []))
        )
    return chosen


def run_search(
    repo: Path, family: str, out: Path, queue: bool = True, baselines: tuple[str, ...] = ()
) -> FamilySearchFile:
    """Run ``family``'s search (``queue``) and gather its runs into ``out``, keeping the
    other families' points there."""
    params = load(repo / "params.yaml")
    if queue:
        queue_search(repo, family)
    runs = collect_runs(repo, ["HEAD", *baselines])
    points = search_points(repo, runs, params, family, current_lock(repo))
    if not points:
        raise ValueError(
            f"no finished search run of family {family!r}: queue it first (minbert lr-search {family})"
        )
    kept = []
    if (repo / out).is_file():
        kept = [p for p in read_family_search(repo / out).points if p.family != family]
    every = kept + points
    study = FamilySearchFile(
        command=COMMAND,
        how="each point: `dvc exp run --queue -S seed=S -S "
        "++scales.<scale>.multitask.rates.<family>.<optimizer>.lr=LR multitask@<config>`; its score "
        "is the kept epoch's validation selection score (dev chooses nothing)",
        points=every,
        chosen=choose(every, family_members(params)),
    )
    write_family_search(study, repo / out)
    return study
