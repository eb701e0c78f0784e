"""The studies' commands of ``minbert`` (registered by minbert.cli): experiments beside
the pipeline, each writing its own file under metrics/ for the report."""

from __future__ import annotations

from pathlib import Path

import typer

from minbert.runs.study_files import LR_SEARCH_FILE


def lr_search(
    family: str = typer.Argument(..., help="A learning-rate family (a rate_family of params.yaml)."),
    out: Path = typer.Option(
        Path("metrics") / LR_SEARCH_FILE,
        "--out",
        help="The search's record (points and choices; the report reads it).",
    ),
    repo: Path = typer.Option(Path("."), "--repo", help="The DVC repository."),
    queue: bool = typer.Option(
        True, "--queue/--no-queue", help="Queue and run the experiments first (--no-queue: gather only)."
    ),
    baseline: list[str] = typer.Option(
        [], "--baseline", help="Also an earlier commit's experiments, where their code is current."
    ),
) -> None:
    """Search a learning-rate family's rates at the committed settings, over seeds.

    For each optimizer the family's configurations use, trains the first of them at every
    rate of params.yaml's `lr_search.lrs` with each of `lr_search.seeds`, one DVC
    experiment each (`dvc exp run --queue`), and chooses the rate with the highest mean
    validation selection score over the seeds (dev chooses nothing). Writes every run,
    each rate's mean and the chosen rate's paired difference from the others to --out;
    put the choice into `scales.<scale>.multitask.rates.<family>` and run `dvc repro`.
    """
    from minbert.tools.lr_search import run_search

    study = run_search(repo, family, out, queue, tuple(baseline))
    for c in (c for c in study.chosen if c.family == family):
        mine = next(g for g in c.grid if g.lr == c.lr)
        typer.echo(
            f"{c.scale}/{family}/{c.optimizer}: lr {c.lr:g} "
            f"(validation mean {mine.mean:.4f} over {len(mine.seeds)} seeds)"
        )


def seed_study(
    out: Path = typer.Option(
        Path("metrics/seed-study.json"), "--out", help="Where to write the study (the report reads it)."
    ),
    repo: Path = typer.Option(Path("."), "--repo", help="The DVC repository."),
    queue: bool = typer.Option(
        True, "--queue/--no-queue", help="Queue and run the experiments first (--no-queue: aggregate only)."
    ),
    baseline: list[str] = typer.Option(
        [], "--baseline", help="Also an earlier commit's experiments, where their code is current."
    ),
    only: list[str] = typer.Option(
        [],
        "--only",
        help="Only this entry (a configuration of `seed_study.configs`, or zero-shot: the untrained "
        "checkpoint); repeat for several. The others stay in --out as they are.",
    ),
) -> None:
    """The seed study of params.yaml's `seed_study`: retrain its configurations, and fit the
    untrained checkpoint's probes (stage zero-shot), with its seeds through DVC's experiment
    queue, then write their full-dev metrics per seed (the committed results are the
    default seed's) to --out.

    Run `dvc repro` afterwards: the report's seed-study section reads --out.
    """
    from minbert.tools.sweep import run_seed_study

    result = run_seed_study(repo, out, queue, tuple(baseline), tuple(only))
    # The command's result goes to stdout (progress and DVC's own output to stderr).
    configs, seeds = len(result["configs"]), result["seeds"]
    typer.echo(f"{repo / out}: {configs} configurations, seeds {seeds}; now run `dvc repro`")


def mlm_study(
    start: list[str] = typer.Option(
        ["continue"], "--start", help="MLM starts to pretrain (names under mlm.starts); repeat for several."
    ),
    repo: Path = typer.Option(Path("."), "--repo", help="The DVC repository."),
) -> None:
    """MLM pretraining, then the configurations of params.yaml's `mlm.finetune` fine-tuned
    again from its checkpoint: one DVC experiment from the current commit, in a temporary
    copy (the default pipeline leaves `mlm.pretrain` empty to keep within its time
    budget). Its metrics files, records and dev predictions are copied to
    metrics/mlm-study/, which the report's MLM section reads.

    Commit metrics/mlm-study/ and run `dvc repro` afterwards.
    """
    from minbert.tools.mlm_study import run_mlm_study

    study = run_mlm_study(repo, list(start))
    # The command's result goes to stdout (progress and DVC's own output to stderr).
    typer.echo(f"{repo / 'metrics' / 'mlm-study'}: experiment {study['experiment']}; now run `dvc repro`")


def extra_runs(
    repo: Path = typer.Option(Path("."), "--repo", help="The DVC repository."),
    from_commit: str = typer.Option(
        "",
        "--from",
        help="Train nothing: keep these configurations' runs as this commit's dvc.lock and "
        "files hold them (a commit whose `dvc repro` still ran them).",
    ),
) -> None:
    """Train the configurations of params.yaml's `configs` that `repro_configs` leaves out
    (the default `dvc repro` skips them to keep within its time budget) as one DVC
    experiment from the current commit, in a temporary copy. Their metrics files and logs
    are copied into metrics/multitask/, their dev predictions into metrics/extra-runs/, and
    the experiment with their stages' dvc.lock entries into metrics/extra-runs.json: the
    report reads them beside the pipeline's runs while the files those stages read are
    unchanged.

    Commit what it wrote and run `dvc repro` afterwards.
    """
    from minbert.tools.extra_runs import keep_from, run_extra_runs

    record = keep_from(repo, from_commit) if from_commit else run_extra_runs(repo)
    # The command's result goes to stdout (progress and DVC's own output to stderr).
    typer.echo(f"{repo / 'metrics' / 'extra-runs.json'}: {', '.join(record['stages'])}; now run `dvc repro`")


# The commands by name, in the order `minbert --help` lists them.
COMMANDS = {
    "lr-search": lr_search,
    "seed-study": seed_study,
    "mlm-study": mlm_study,
    "extra-runs": extra_runs,
}
