"""The offline GPU node's commands of ``minbert`` (``bundle``, ``offline-run``,
``gpu-unpack``, ``gpu-status``): planning a study on the DVC machine, running it on a
node without DVC, and bringing its results back. ``minbert.cli`` adds them to the
command line (here so that cli.py stays one readable file)."""

from __future__ import annotations

from pathlib import Path

import typer

from minbert.gpu_study import GPU_RESULTS_DIR
from minbert.offline.calls import PERIOD_MINUTES, STUDY_OPS
from minbert.progress import console
from minbert.runs.gpu_calls import read_gpu_provenance


def bundle(
    out: Path = typer.Argument(..., help="A new directory for the bundle, e.g. offline-bundle."),
    set_: list[str] = typer.Option(
        [], "--set", help="KEY.PATH=VALUE of params.yaml for the study (repeat), as `dvc exp run -S`."
    ),
    data: Path | None = typer.Option(
        None, "--data", help="The course CSV files (default: as `prepare` finds them)."
    ),
) -> None:
    """Plan a study for an offline node and pack what the node lacks.

    DVC resolves the stages for params.yaml with the --set overrides (on a copy); the
    bundle holds that plan, the course CSV files and the checkpoint as an fp16 copy.
    Refused when one call would send the node more than it takes (the repository's
    files as git sends them, and the bundle)."""
    from minbert.offline.bundle import bundle_study

    console.print(bundle_study(Path("."), out, set_, data))


def offline_run(
    bundle_dir: Path = typer.Argument(..., help="The bundle (`minbert bundle`), inside the repository."),
    out: Path = typer.Option(
        ..., "--out", help="The folder that comes back: the results, at most 8 files of 16 MiB."
    ),
    stage: list[str] = typer.Option(
        [], "--stage", help="A stage or a group of the plan (repeat), with the stages it needs; none: all."
    ),
    deadline: float | None = typer.Option(
        None,
        "--deadline",
        help="Minutes for the whole call: a stage is not started unless its worst estimate fits the "
        "time left; what runs then is stopped; what finished is kept.",
    ),
    smoke: bool = typer.Option(
        False, "--smoke", help="The smoke call instead: check the GPU path, measure, write smoke.json."
    ),
    lanes: int | None = typer.Option(
        None,
        "--lanes",
        min=1,
        help="Stages run side by side, each with the cores / lanes threads (default: the bundle's plan).",
    ),
) -> None:
    """Run a bundle's plan without DVC (an offline GPU node), packing each stage's results
    and log into --out as it finishes. Runs in the repository root, nothing installed:
    `PYTHONPATH=src python3 -m minbert offline-run offline-bundle --out OUT --deadline 9`.
    Up to --lanes stages whose inputs are ready run at once, the longest expected first; a
    stage whose worst estimate exceeds the time left before --deadline is not started.
    Exit status 1 when a stage failed or was not run.

    With --smoke: a PCGrad + SMART stage and a round-robin stage on a slice, their losses
    and SMART's control term checked, the seconds and operators of a step measured, into
    --out/smoke.json (`minbert gpu-plan` cuts the study's calls from it); exit status 1
    when a check fails."""
    if smoke:
        from minbert.offline.smoke import smoke_call, summary

        if stage:
            raise typer.BadParameter("--smoke runs its own stages: name none", param_hint="--stage")
        found = smoke_call(Path("."), bundle_dir, out, deadline, log=console.log)
        for line in summary(found):
            console.print(line)
        if not found["passed"]:
            raise typer.Exit(1)
        return
    from minbert.offline.runner import run_call

    def log(text: str) -> None:  # a traceback is printed as it is, not as markup
        console.log(text, markup=False, highlight=False)

    index = run_call(Path("."), bundle_dir, out, stage, deadline, log=log, lanes=lanes)
    console.print(
        f"{out}: {len(index['stages'])} stages finished in {index['seconds']:.0f} s on {index['device']} "
        f"in {index['lanes']} lane(s) of {index['threads']} thread(s), {len(index['parts'])} part(s)"
    )
    for left in index["failed"] + index["not_run"]:
        console.print(f"  {left['stage']}: {left['reason']}")
    if index["failed"] or index["not_run"]:
        raise typer.Exit(1)


def gpu_plan(
    smoke: Path | None = typer.Option(
        None,
        "--smoke",
        help="smoke.json of a smoke call (default: the study's calls in --into, else 10 us per operator).",
    ),
    ops: Path = typer.Option(STUDY_OPS, "--ops", help="The study's operators per stage (bench/step_ops.py)."),
    into: Path = typer.Option(GPU_RESULTS_DIR, "--into", help="The GPU results folder."),
    period: float = typer.Option(
        PERIOD_MINUTES,
        "--period",
        help="Device minutes a period's calls may spend (the rest: the machine's starts and transfers).",
    ),
    lanes: int | None = typer.Option(
        None, "--lanes", min=1, help="Lanes a call runs (default: the fewest that end the study soonest)."
    ),
    not_current: bool = typer.Option(
        False, "--not-current", help="Leave out the stages current in --into (default: every stage)."
    ),
) -> None:
    """Cut the gpu study into node calls run in lanes, from a measured rate.

    Each stage's operators (counted on the CPU) at a measured rate (the smoke call's, or
    one fitted to the study's calls in --into), with its start-up, times a margin and,
    in lanes, the slowdown of sharing the GPU (measured by the study's lane calls, else
    assumed x1.5). Every stage of the study goes in as few calls as hold it, each within
    its 9-minute deadline at the worst estimate, so that every GPU result comes from one
    commit; a stage left to a later call is named with why. The first period opens with
    the smoke call until --into holds a call of the study."""
    import json

    from minbert.offline.calls import cut, describe, read_ops, study_rate

    _, measured = read_ops(ops)
    calls = read_gpu_provenance(into).calls
    rate = study_rate(calls, measured, json.loads(smoke.read_text()) if smoke is not None else None)
    names = list(measured)
    if not_current and calls:
        from minbert.offline.gpu_results import status

        current = {s.stage for s in status(into) if s.state == "current"}
        names = [n for n in names if n not in current]
    plan = cut(measured, rate, names, period=period, smoke_first=not calls, lanes=lanes)
    for line in describe(plan):
        typer.echo(line)


def gpu_unpack(
    index: Path = typer.Argument(..., help="gpu-results.json of a call, with its parts beside it."),
    into: Path = typer.Option(GPU_RESULTS_DIR, "--into", help="The GPU results folder."),
) -> None:
    """Add a call's results to the GPU results folder (a stage brought back again: the
    newest call's wins)."""
    from minbert.offline.gpu_results import unpack

    changed = unpack(index, into)
    console.print(f"{into}: added {', '.join(changed['added']) or 'no stage'}")
    if changed["kept"]:
        console.print(f"  kept a newer call's {', '.join(changed['kept'])}")
    if changed["failed"]:
        console.print(f"  failed: {', '.join(changed['failed'])}")


def gpu_status(
    into: Path = typer.Option(GPU_RESULTS_DIR, "--into", help="The GPU results folder."),
) -> None:
    """Every stage of the GPU results against the plan DVC resolves now: current, stale
    (what changed) or missing, as `dvc status` does for the CPU results; exit status 1
    unless every stage is current."""
    from minbert.offline.gpu_results import status

    found = status(into)
    for s in found:
        typer.echo(f"{s.stage}: {s.state}{': ' + '; '.join(s.reasons) if s.reasons else ''}")
    if any(s.state != "current" for s in found):
        raise typer.Exit(1)


# The commands by name, in the order `minbert --help` lists them.
COMMANDS = {
    "bundle": bundle,
    "offline-run": offline_run,
    "gpu-plan": gpu_plan,
    "gpu-unpack": gpu_unpack,
    "gpu-status": gpu_status,
}
