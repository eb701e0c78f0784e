"""The report's figures from the histories and PCGrad logs: bare matplotlib figures saved
without metadata, so equal data gives byte-identical PNG files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minbert.report.formatting import per_task
from minbert.report.notes import epoch_count, usual
from minbert.results import CONFLICTS, COSINE_COLUMNS, HISTORY, TASK_PAIRS, history_column, run_log
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS

FIGURE_KINDS = ("loss", "average", "conflicts", "every-average")
# Phrases the captions share.
EPOCH_ZERO = "Epoch 0 is the checkpoint before any update (its heads fresh, or fitted by the warm-up)."
AVERAGE_OF = "average of " + ", ".join(TASKS[t].metric_title for t in MULTITASK_TASKS)


def configs_of(spec: dict, multitask_dir: Path) -> list[dict]:
    """A figure's configurations with their labels; ``configs: all``: every run's history."""
    if spec["configs"] == "all":
        return [
            {"config": p.name[: -len(HISTORY)], "label": p.name[: -len(HISTORY)]}
            for p in sorted(Path(multitask_dir).glob(f"*{HISTORY}"))
        ]
    return spec["configs"]


def _missing_inputs(spec: dict, multitask_dir: Path, display_dir: str) -> list[str]:
    """The files a figure needs that are absent (or, for conflicts, hold no steps)."""
    suffix = CONFLICTS if spec["kind"] == "conflicts" else HISTORY
    if not configs_of(spec, multitask_dir):
        return [f"`{display_dir}/*{suffix}`"]
    missing = []
    for entry in configs_of(spec, multitask_dir):
        path = run_log(multitask_dir, entry["config"], suffix)
        if not path.is_file():
            missing.append(f"`{display_dir}/{path.name}`")
        elif spec["kind"] == "conflicts" and pd.read_csv(path).empty:
            # Written header-only for round-robin runs: nothing to draw.
            missing.append(f"`{display_dir}/{path.name}` (no PCGrad steps recorded)")
    return missing


def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    frame = pd.read_csv(path)
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise ValueError(f"{path}: missing column(s) {', '.join(absent)}")
    return frame


def _epochs_axis(ax, ylabel: str | None) -> None:
    """Epochs on the x axis, whole numbers only; ``ylabel`` on the y axis."""
    ax.set_xlabel("epoch")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.xaxis.get_major_locator().set_params(integer=True)


def _train_and_dev(ax, history: pd.DataFrame, key: str, colour: str, label: str) -> None:
    """A configuration's ``key`` on the training slice (solid) and the dev slice (dashed) per epoch."""
    for split, style in (("train", "-"), ("dev", "--")):
        ax.plot(
            history.epoch,
            history[history_column(split, key)],
            color=colour,
            marker="o",
            linestyle=style,
            label=f"{label}, {split}",
        )


def _draw_loss(fig, spec: dict, multitask_dir: Path) -> str:
    tasks = list(MULTITASK_TASKS)
    axes = fig.subplots(1, len(tasks))
    colours = [f"C{i}" for i in range(len(spec["configs"]))]
    for entry, colour in zip(spec["configs"], colours):
        history = _read_csv(
            run_log(multitask_dir, entry["config"], HISTORY),
            ["epoch"] + [history_column(k, TASKS[t].loss_key) for t in tasks for k in ("train", "dev")],
        )
        for ax, task in zip(axes, tasks):
            _train_and_dev(ax, history, TASKS[task].loss_key, colour, entry["label"])
    for ax, task in zip(axes, tasks):
        ax.set_title(TASKS[task].title)
        _epochs_axis(ax, "loss" if ax is axes[0] else None)
    axes[0].legend(fontsize="small")
    return (
        f"Solid lines: each epoch's mean training loss of the task alone (without SMART's terms), "
        f"from epoch 1; dashed lines: the loss on the history's fixed dev slice, from epoch 0. "
        f"{EPOCH_ZERO} One panel per task, one colour per configuration."
    )


def _draw_average(fig, spec: dict, multitask_dir: Path) -> str:
    ax = fig.subplots()
    for k, entry in enumerate(spec["configs"]):
        history = _read_csv(
            run_log(multitask_dir, entry["config"], HISTORY),
            ["epoch", history_column("train", AVERAGE), history_column("dev", AVERAGE)],
        )
        _train_and_dev(ax, history, AVERAGE, f"C{k}", entry["label"])
    _epochs_axis(ax, "average metric")
    ax.legend(fontsize="small")
    return (
        f"Solid lines: the {AVERAGE_OF} on the history's fixed slice of the training examples; "
        f"dashed lines: the same on its fixed dev slice. {EPOCH_ZERO} One colour per configuration."
    )


def _draw_every_average(fig, spec: dict, multitask_dir: Path) -> str:
    ax = fig.subplots()
    entries = configs_of(spec, multitask_dir)
    for k, entry in enumerate(entries):
        history = _read_csv(
            run_log(multitask_dir, entry["config"], HISTORY), ["epoch", history_column("dev", AVERAGE)]
        )
        style = ["-", "--", ":", "-."][k // 10 % 4]  # ten colours, then another line style
        ax.plot(
            history.epoch,
            history[history_column("dev", AVERAGE)],
            marker="o",
            color=f"C{k % 10}",
            linestyle=style,
            label=entry["label"],
        )
    _epochs_axis(ax, "average metric, dev slice")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    styles = " (past ten, the colours repeat with another line style)" if len(entries) > 10 else ""
    return (
        f"One line per configuration{styles}: the {AVERAGE_OF} on the history's fixed dev slice "
        f"after each epoch. {EPOCH_ZERO} The same data as `dvc plots show`'s dev-average plot, "
        "for reading offline."
    )


def _smoothing(steps: int) -> int:
    """The moving-average window of the per-step cosines: about 50 windows per run, at
    least 5 steps, none for a run too short to smooth."""
    return 1 if steps < 25 else max(5, steps // 50)


def _draw_conflicts(fig, spec: dict, multitask_dir: Path) -> str:
    axes = fig.subplots(len(spec["configs"]), 2, squeeze=False)
    summary, windows = [], set()
    for (cos_ax, frac_ax), entry in zip(axes, spec["configs"]):
        steps = _read_csv(run_log(multitask_dir, entry["config"], CONFLICTS), ["step", "conflicts", "pairs"])
        window = _smoothing(len(steps))
        windows.add(window)
        for k, (column, tasks) in enumerate((c, p) for c, p in zip(COSINE_COLUMNS, TASK_PAIRS) if c in steps):
            pair = " · ".join(TASKS[t].title for t in tasks)
            if window == 1:
                cos_ax.plot(steps.step, steps[column], color=f"C{k}", linewidth=1.0, label=pair)
                continue
            # Per-step cosines are noisy: drawn faintly, their moving average on top.
            cos_ax.plot(steps.step, steps[column], color=f"C{k}", linewidth=0.5, alpha=0.3)
            cos_ax.plot(
                steps.step,
                steps[column].rolling(window, min_periods=1).mean(),
                color=f"C{k}",
                linewidth=1.5,
                label=f"{pair} (mean of {window} steps)",
            )
        cos_ax.axhline(0.0, color="black", linewidth=0.6)
        # Same definition as the stage's pcgrad_conflict_fraction: conflicting pairs
        # over all pairs seen, so the title matches the run's record.
        overall = steps.conflicts.sum() / steps.pairs.sum()
        cos_ax.set_title(entry["label"], fontsize="medium")
        summary.append(f"`{entry['config']}` {overall:.3f}")
        cos_ax.set_ylabel("gradient cosine")
        cos_ax.legend(fontsize="small")
        frac_ax.plot(steps.step, steps.conflicts.cumsum() / steps.pairs.cumsum())
        frac_ax.set_ylim(0.0, 1.0)
        frac_ax.set_ylabel("conflicting pairs so far")
        frac_ax.set_title(f"running conflict fraction (overall {overall:.3f})", fontsize="medium")
    axes[-1][0].set_xlabel("training step")
    axes[-1][1].set_xlabel("training step")
    if windows == {1}:
        drawn = "the cosine of each pair of task gradients on the shared encoder at every PCGrad step"
    else:
        sizes = " or ".join(str(w) for w in sorted(windows - {1}))
        drawn = (
            "the cosine of each pair of task gradients on the shared encoder at every PCGrad "
            f"step (faint) and its moving average over {sizes} steps (bold)"
        )
    return (
        f"Left, one row per configuration: {drawn}; below zero the pair conflicts and PCGrad "
        "projects one gradient off the other. Right: the fraction of task-gradient pairs that "
        "conflicted up to each step. Overall fraction of conflicting pairs: " + "; ".join(summary) + "."
    )


# Each draws onto an empty figure and returns the caption's account of what it drew
# (line styles, smoothing, and numbers a reader should not have to read off the plot).
DRAW = {
    "loss": _draw_loss,
    "average": _draw_average,
    "conflicts": _draw_conflicts,
    "every-average": _draw_every_average,
}


def draw_figure(spec: dict, multitask_dir: Path, path: Path) -> str:
    """Draw one figure to a PNG file whose bytes depend only on the data; return what the
    caption says of the drawing."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    height = {"loss": 4.0, "average": 4.0, "every-average": 4.5}.get(spec["kind"], 3.2 * len(spec["configs"]))
    width = {"average": 7.0, "every-average": 9.0}.get(spec["kind"], 13.0)
    # The default style, not the user's matplotlibrc, so every machine draws alike.
    # The hash salt only matters for SVG output; fixed so that would be stable too.
    with matplotlib.style.context("default"), matplotlib.rc_context({"svg.hashsalt": "minbert"}):
        # A bare Figure on the Agg canvas: no pyplot global state, no GUI backend.
        fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        drawn = DRAW[spec["kind"]](fig, spec, multitask_dir)
        fig.suptitle(spec["title"])
        # PNG metadata would otherwise carry the matplotlib version; no timestamps are
        # written, so equal data gives byte-identical files.
        fig.savefig(path, format="png", metadata={"Software": None})
    return drawn


def figures_source(runs: dict, display_dir: str) -> str:
    """Which runs the figures draw: their files, scale, seed, epochs and history slices."""
    scale = usual({n: f"`{m.scale}`" for n, m in runs.items()})
    seed = usual({n: str(m.seed) for n, m in runs.items()})
    epochs = usual({n: epoch_count(m.epochs) for n, m in runs.items()})
    dev, train = (
        usual({n: per_task(m.history_examples[part]) for n, m in runs.items()}) for part in ("dev", "train")
    )
    return (
        f"Drawn from the runs' histories and per-step files in `{display_dir}` (scale {scale}, seed "
        f"{seed}, {epochs}; the history's fixed slices: dev {dev}, training {train} examples per "
        "task): the tables' runs, not the seed study's or the GPU's."
    )


def figure_section(spec: dict, multitask_dir: Path, display_dir: str, out_dir: Path) -> str:
    """Draw one figure into out_dir and return its README section (or why it is absent)."""
    lines = [f"### {spec['title']}", ""]
    missing = _missing_inputs(spec, multitask_dir, display_dir)
    if missing:
        lines.append(
            f"Not drawn: missing metrics {', '.join(missing)} "
            "(run the `multitask` stage for these configurations)."
        )
        return "\n".join(lines)
    drawn = draw_figure(spec, multitask_dir, out_dir / spec["file"])
    # Semicolons: the labels themselves contain commas.
    if spec["configs"] == "all":
        caption = f"{spec['caption'].strip()} {drawn}"
    else:
        compared = "; ".join(f"{e['label']} (`{e['config']}`)" for e in spec["configs"])
        caption = f"{spec['caption'].strip()} Configurations: {compared}. {drawn}"
    lines += [f"![{spec['title']}]({spec['file']})", "", caption]
    return "\n".join(lines)
