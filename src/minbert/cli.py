"""The ``minbert`` command line.

The pipeline itself runs through DVC (``dvc repro``); these commands are what a
researcher uses around it: checking a data file or a parameters file before a
long run, inspecting a checkpoint, and aggregating a sweep of experiments.
"""

from __future__ import annotations

from pathlib import Path

import typer

from minbert.data.tasks import TASKS
from minbert.progress import console

app = typer.Typer(
    help="minBERT: a from-scratch BERT encoder and a reproducible DVC fine-tuning pipeline.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def validate(
    file: Path = typer.Argument(..., help="A course-format CSV file (tab-separated)."),
    task: str = typer.Option(..., "--task", help=f"Which task's format: {', '.join(TASKS)}."),
) -> None:
    """Check a data file row by row; print `file:line: reason` for every problem.

    Exit status 0 when the file is good, 1 when it has problems, 2 on bad usage.
    """
    from minbert.data.csvfile import validate_task_csv

    if task not in TASKS:
        console.print(f"--task {task!r} is not one of {', '.join(TASKS)}")
        raise typer.Exit(2)
    problems = validate_task_csv(file, task)
    for problem in problems:
        typer.echo(str(problem))
    if problems:
        raise typer.Exit(1)
    console.print(f"{file}: ok ({task})")


@app.command("check-params")
def check_params(
    file: Path = typer.Argument(Path("params.yaml"), help="The parameters file to check."),
) -> None:
    """Check a parameters file against the schema (unknown keys and values are errors)."""
    from minbert.params import ParamsError, load

    try:
        load(file)
    except ParamsError as exc:
        typer.echo(str(exc))
        raise typer.Exit(1) from None
    console.print(f"{file}: ok")


@app.command()
def checkpoint(
    name: str = typer.Argument("all-minilm-l6-v2", help="Packaged name, local directory or hub name."),
) -> None:
    """Resolve a checkpoint, load it into the encoder and report what was loaded."""
    from minbert.model import BertModel
    from minbert.model.checkpoint import resolve_checkpoint

    directory = resolve_checkpoint(name)
    model = BertModel.from_pretrained(directory)
    cfg = model.config
    console.print(f"{name}: {directory}")
    console.print(f"  {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                  f"{cfg.num_attention_heads} heads, vocabulary {cfg.vocab_size}, "
                  f"{sum(p.numel() for p in model.parameters()):,} parameters")
    console.print(f"  {model.load_report}")


@app.command("sweep-report")
def sweep_report(
    out: Path = typer.Option(None, "--out", help="Also write the Markdown to this file."),
    repo: Path = typer.Option(Path("."), "--repo", help="The DVC repository of the sweep."),
) -> None:
    """Aggregate a sweep of DVC experiments over seeds: mean ± std per configuration.

    Reads the baseline commit and its finished experiments (`dvc exp show`),
    groups the runs whose parameters differ only in `seed`, and prints one table
    per group.
    """
    from minbert.atomic import atomic_write_text
    from minbert.sweep import aggregate, collect_runs

    try:
        text = aggregate(collect_runs(repo))
    except ValueError as exc:
        console.print(str(exc))
        raise typer.Exit(1) from None
    typer.echo(text)
    if out is not None:
        atomic_write_text(out, text + "\n")


SEED_STUDY_COMMAND = "minbert seed-study"


@app.command("seed-study")
def seed_study(
    out: Path = typer.Option(Path("metrics/seed-study.json"), "--out",
                             help="Where to write the study (the report reads this file)."),
    repo: Path = typer.Option(Path("."), "--repo", help="The DVC repository."),
    queue: bool = typer.Option(True, "--queue/--no-queue",
                               help="Queue and run the experiments first (--no-queue: only "
                                    "aggregate experiments that already ran)."),
) -> None:
    """The seed study of params.yaml's `seed_study`: retrain its configurations with its
    seeds through DVC's experiment queue, then write each configuration's full-dev
    metrics per seed (the committed results are the default seed's) to --out.

    Run `dvc repro` afterwards: the report's seed-study section reads --out.
    """
    import json
    import subprocess

    from minbert.atomic import atomic_write_text
    from minbert.params import ParamsError, load
    from minbert.sweep import DVC, collect_runs, wait_for_queue
    from minbert.sweep import seed_study as aggregate

    try:
        params = load(repo / "params.yaml")
    except ParamsError as exc:
        typer.echo(str(exc))
        raise typer.Exit(1) from None
    study = params["seed_study"]
    targets = [f"multitask@{c}" for c in study["configs"]]
    if queue:
        for seed in study["seeds"]:
            subprocess.run([*DVC, "exp", "run", "--queue", "-S", f"seed={seed}", *targets],
                           cwd=repo, check=True)
        subprocess.run([*DVC, "queue", "start", "--jobs", str(study["jobs"])], cwd=repo, check=True)
        states = wait_for_queue(repo)
        failed = {name: state for name, state in states.items() if state != "Success"}
        if failed:
            console.print(f"experiments that did not succeed (see `dvc queue logs NAME`): {failed}")
    try:
        configs = aggregate(collect_runs(repo), params, study["configs"])
    except ValueError as exc:
        console.print(str(exc))
        raise typer.Exit(1) from None
    seeds = sorted({r["seed"] for runs in configs.values() for r in runs})
    text = json.dumps({
        "command": SEED_STUDY_COMMAND,
        "how": f"queues `dvc exp run -S seed=N {' '.join(targets)}` for each seed of "
               "`seed_study.seeds`, runs the queue and aggregates the finished experiments "
               "with the committed results",
        "seeds": seeds,
        "configs": configs,
    }, indent=2) + "\n"
    atomic_write_text(repo / out, text)
    console.print(f"{repo / out}: {len(configs)} configurations, seeds {seeds}; now run `dvc repro`")


if __name__ == "__main__":
    app()
