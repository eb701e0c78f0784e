"""The ``minbert`` command line.

The pipeline itself runs through DVC (``dvc repro``); these commands are what a
researcher uses around it: checking a data file or a parameters file before a long
run, inspecting a checkpoint, using a fine-tuned model on new text (``predict``,
``evaluate``), and aggregating sweeps of experiments. Each calls the functions the
stages use. Bad input of any kind ends in one line naming the file and the reason
and a non-zero exit; ``minbert --debug COMMAND`` shows the traceback instead.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import typer

from minbert import cli_offline, cli_studies
from minbert.cli_help import Command, Group, RepeatedValues
from minbert.errors import report_errors
from minbert.progress import console
from minbert.tasks import MULTITASK_TASKS, TASKS

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)
_debug = {"on": False}


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        import torch

        console.print(f"minbert {version('minbert')} (torch {torch.__version__})")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """minBERT: a from-scratch BERT encoder and a reproducible DVC fine-tuning pipeline."""
    _debug["on"] = debug


def command(name: str | None = None):
    """A command whose errors end in one line (see ``minbert.errors``)."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with report_errors(debug=_debug["on"]):
                return fn(*args, **kwargs)

        return app.command(name, cls=Command)(run)

    return wrap


def _task(task: str, allowed=tuple(TASKS)) -> str:
    if task not in allowed:
        console.print(f"--task {task!r} is not one of {', '.join(allowed)}")
        raise typer.Exit(2)
    return task


@command()
def validate(
    file: Path = typer.Argument(..., help="A course-format CSV file, or a CSV/TSV with named columns."),
    task: str = typer.Option(..., "--task", help=f"Which task's format: {', '.join(TASKS)}."),
    unlabelled: bool = typer.Option(
        False, "--unlabelled", help="The file has no labels (a test file); without this, labels are required."
    ),
    named: bool = typer.Option(
        False, "--named", help="A plain CSV (.csv) or TSV file whose header names its columns."
    ),
) -> None:
    """Check a data file row by row; print `file:line: reason` for every problem.

    A file without the task's label column is an error unless it is a course test
    file or `--unlabelled` says so. Exit status 0 when the file is good, 1 when it
    has problems, 2 on bad usage.
    """
    from minbert.data.csvfile import validate_task_csv

    task = _task(task)
    course_test_file = file.name == TASKS[task].files["test"]
    problems = validate_task_csv(file, task, named=named, labelled=not (unlabelled or course_test_file))
    for problem in problems:
        typer.echo(str(problem))
    if problems:
        raise typer.Exit(1)
    console.print(f"{file}: ok ({task}, {'unlabelled' if unlabelled or course_test_file else 'labelled'})")


@command("check-params")
def check_params(
    file: Path = typer.Argument(Path("params.yaml"), help="The parameters file to check."),
) -> None:
    """Check a parameters file against the schema (unknown keys and values are errors)."""
    from minbert.pipeline.params import load

    load(file)
    console.print(f"{file}: ok")


@command()
def checkpoint(
    name: str = typer.Argument("all-minilm-l6-v2", help="Packaged name, local directory or hub name."),
    revision: str = typer.Option("main", "--revision", help="A hub name's branch, tag or commit."),
) -> None:
    """Resolve a checkpoint, load it into the encoder and report what was loaded."""
    from minbert.model.bert import BertModel
    from minbert.model.checkpoint import resolve_checkpoint

    directory = resolve_checkpoint(name, revision=revision)
    model = BertModel.from_pretrained(directory)
    cfg = model.config
    console.print(f"{name}: {directory}")
    console.print(
        f"  {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads} heads, vocabulary {cfg.vocab_size}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters"
    )
    console.print(f"  {model.load_report}")


@command()
def predict(
    model: Path = typer.Argument(..., help="A fine-tuned model directory, e.g. models/multitask/best."),
    file: Path = typer.Argument(None, help="A course-format file, or a CSV/TSV with named columns."),
    task: str = typer.Option(..., "--task", help="sst, quora or sts."),
    out: Path = typer.Option(None, "--out", "-o", help="Where to write the predictions (course format)."),
    text: list[str] = typer.Option(None, "--text", help="A sentence to classify (sst); repeatable."),
    pair: RepeatedValues = typer.Option(
        None, "--pair", metavar="FIRST SECOND", help="Two sentences to compare (quora, sts); repeatable."
    ),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
) -> None:
    """Predict with a fine-tuned multitask model: a file, or sentences given with --text or --pair.

    Printed with Quora's probability of a paraphrase and SST's two most probable
    classes; with --out, a file's predictions are written in the course's submission
    format instead."""
    from minbert.tools import predict as predicting

    task = _task(task, MULTITASK_TASKS)
    if (file is None) == (not text and not pair):
        console.print("give either a FILE or --text / --pair")
        raise typer.Exit(2)
    predictor = predicting.Predictor(model, device)
    if file is None:
        frame = predicting.texts_frame(task, text, pair)
        typer.echo("\n".join(predicting.shown(predictor.predict(frame, task, "command line"), frame)))
        return
    frame = predicting.read_input(file, task, predicting.known_bad_rows(file))
    predicted = predictor.predict(frame, task, str(file), show_progress=True)
    if out is None:
        typer.echo("\n".join(predicting.shown(predicted)))
    else:
        predicting.write(predicted, out)
        console.print(f"{out}: {len(predicted.ids)} predictions ({task})")


@command()
def evaluate(
    model: Path = typer.Argument(..., help="A fine-tuned model directory, e.g. models/multitask/best."),
    file: Path = typer.Argument(..., help="A labelled course-format file, or a CSV/TSV with named columns."),
    task: str = typer.Option(..., "--task", help="sst, quora or sts."),
    out: Path = typer.Option(None, "--out", "-o", help="Also write the result as JSON."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    allow_training_rows: bool = typer.Option(
        False, "--allow-training-rows", help="Score a file that shares rows with the model's training rows."
    ),
) -> None:
    """Score a fine-tuned multitask model on a labelled file: accuracy (SST, Quora) or
    Pearson's r (STS) with a 95% bootstrap interval over the file's examples.

    FILE may be a course file (its known-bad rows, listed in params.yaml, left out), a
    CSV/TSV with named columns, or a table the data stage prepared: the Quora pairs the
    pipeline holds out are data/prepared/quora-dev.parquet. A file that shares rows with
    the model's training rows (its directory records them) is refused unless
    --allow-training-rows."""
    from minbert.atomic import atomic_write_text
    from minbert.tools import predict as predicting

    task = _task(task, MULTITASK_TASKS)
    frame = predicting.read_input(file, task, predicting.known_bad_rows(file))
    warning = predicting.check_labels(frame, task, str(file))  # before the predictions, not after
    if warning:
        console.print(f"warning: {warning}")
    console.print(predicting.training_rows(model, frame, task, str(file), allow_training_rows))
    predictor = predicting.Predictor(model, device)
    predicted = predictor.predict(frame, task, str(file), show_progress=True)
    result, summary = predicting.score(predicted)
    summary["model"] = str(model)
    console.print(predicting.score_table(f"{model} on {file}", result, summary))
    typer.echo(json.dumps(summary, indent=2))
    if out is not None:
        atomic_write_text(out, json.dumps(summary, indent=2) + "\n")


@command("sweep-report")
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
    from minbert.tools.sweep import aggregate, collect_runs

    text = aggregate(collect_runs(repo))
    typer.echo(text)
    if out is not None:
        atomic_write_text(out, text + "\n")


@command()
def compare(
    metric: list[str] = typer.Option(
        None,
        "--metric",
        help="A metrics-file key to compare (repeat); default: sst, quora, sts, average, accuracy.",
    ),
    repo: Path = typer.Option(Path("."), "--repo", help="The DVC repository."),
) -> None:
    """Compare DVC experiments: one table per metric, a row per run, a column per experiment.

    Reads `dvc exp show --json` (the committed baseline and its experiments) and prints,
    for each metric, every run's value in each experiment with its difference from the
    experiment's parent (the baseline; HEAD for the workspace) and a paired 95% bootstrap
    interval from both runs' dev predictions, marked ~ when it includes 0; then the
    parameters each experiment changed, and the runs that differ for another reason
    (a rebuild from the same inputs, changed code or data). As many experiments as fit
    the terminal's width are shown.
    """
    from minbert.tools.compare import print_comparison

    print_comparison(repo, metric or None)


@command()
def reach(
    set_: list[str] = typer.Option(
        [], "--set", "-S", help="KEY.PATH=VALUE of params.yaml (repeat), as `dvc exp run -S` takes it."
    ),
    repo: Path = typer.Option(Path("."), "--repo", help="The DVC repository."),
) -> None:
    """List the stages `dvc exp run -S KEY=VALUE` would rerun, before it runs.

    DVC answers on a scratch copy of dvc.yaml, dvc.lock and params.yaml with the -S
    applied: the stages whose params or settings files (written by `resolve`) differ
    from dvc.lock, with what changed, then those downstream of them, in DVC's order.
    Nothing in the repository changes; stages already stale for another reason (code,
    data) are `dvc status`'s."""
    from minbert.tools.reach import describe

    typer.echo(describe(repo, set_))


@command()
def readme(
    check: bool = typer.Option(
        False, "--check", help="Only say whether they are current (exit status 1 if not)."
    ),
    repo: Path = typer.Option(
        Path("."), "--repo", help="The repository: its README.md, docs/, metrics/, reference/, bench/."
    ),
) -> None:
    """Rewrite the generated blocks of the README and the docs from the committed results.

    The README's set our results beside the paper's (reference/paper.yaml) and name the
    configuration the report ranks highest on the chance-corrected dev score, beside the
    untrained checkpoint; docs/performance.md's gives every stage's minutes and memory from
    the last `python bench/stage_memory.py -- dvc repro`. Run this after either changes
    them (tests/test_readme.py fails until then)."""
    from minbert.tools.readme import update

    stale = update(repo, check=check)
    if not stale:
        console.print(f"{repo}: the generated blocks are current")
    elif check:
        console.print(
            f"{', '.join(map(str, stale))}: generated blocks differ from the results: run `minbert readme`"
        )
        raise typer.Exit(1)
    else:
        console.print(f"{', '.join(map(str, stale))}: generated blocks rewritten from the results")


# ----------------------------------------------------------------------------- studies

# Defined in minbert.cli_studies, in its order.
for _name, _command in cli_studies.COMMANDS.items():
    command(_name)(_command)


# ----------------------------------------------------------------------------- offline GPU nodes

# Defined in minbert.cli_offline; listed last, in its order.
for _name, _command in cli_offline.COMMANDS.items():
    command(_name)(_command)


if __name__ == "__main__":
    app()
