"""The report's figures, drawn from the per-epoch history and per-step conflict files.

Each figure is a bare matplotlib ``Figure`` on the Agg canvas in the default style,
saved without metadata, so equal data gives byte-identical PNG files.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minbert.metrics import MULTITASK_TASKS
from minbert.report.cells import TASK_TITLES

FIGURE_KINDS = ("loss", "average", "conflicts")


def _missing_inputs(spec: dict, multitask_dir: Path, display_dir: str) -> list[str]:
    """The files a figure needs that are absent (or, for conflicts, hold no steps)."""
    suffix = "-conflicts.csv" if spec["kind"] == "conflicts" else "-history.csv"
    missing = []
    for entry in spec["configs"]:
        path = multitask_dir / f"{entry['config']}{suffix}"
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


def _draw_loss(fig, spec: dict, multitask_dir: Path) -> str:
    tasks = list(MULTITASK_TASKS)
    axes = fig.subplots(1, len(tasks))
    colours = [f"C{i}" for i in range(len(spec["configs"]))]
    for entry, colour in zip(spec["configs"], colours):
        history = _read_csv(
            multitask_dir / f"{entry['config']}-history.csv",
            ["epoch"] + [f"{k}_loss_{t}" for t in tasks for k in ("train", "dev")],
        )
        for ax, task in zip(axes, tasks):
            ax.plot(
                history.epoch,
                history[f"train_loss_{task}"],
                color=colour,
                marker="o",
                label=f"{entry['label']}, train",
            )
            ax.plot(
                history.epoch,
                history[f"dev_loss_{task}"],
                color=colour,
                marker="o",
                linestyle="--",
                label=f"{entry['label']}, dev",
            )
    for ax, task in zip(axes, tasks):
        ax.set_title(TASK_TITLES[task])
        ax.set_xlabel("epoch")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].set_ylabel("loss")
    axes[0].legend(fontsize="small")
    return ""


def _draw_average(fig, spec: dict, multitask_dir: Path) -> str:
    ax = fig.subplots()
    for k, entry in enumerate(spec["configs"]):
        history = _read_csv(
            multitask_dir / f"{entry['config']}-history.csv", ["epoch", "train_average", "dev_average"]
        )
        ax.plot(
            history.epoch, history.train_average, marker="o", color=f"C{k}", label=f"{entry['label']}, train"
        )
        ax.plot(
            history.epoch,
            history.dev_average,
            marker="o",
            color=f"C{k}",
            linestyle="--",
            label=f"{entry['label']}, dev",
        )
    ax.set_xlabel("epoch")
    ax.set_ylabel("average metric")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize="small")
    return ""


def _draw_conflicts(fig, spec: dict, multitask_dir: Path) -> str:
    axes = fig.subplots(len(spec["configs"]), 2, squeeze=False)
    summary = []
    for (cos_ax, frac_ax), entry in zip(axes, spec["configs"]):
        steps = _read_csv(multitask_dir / f"{entry['config']}-conflicts.csv", ["step", "conflicts", "pairs"])
        # Per-step cosines are noisy: drawn faintly, with a moving average on top
        # (about 50 windows per run) so the trend stays readable at any run length.
        window = max(1, len(steps) // 50)
        for k, column in enumerate(c for c in steps.columns if c.startswith("cos_")):
            pair = " · ".join(TASK_TITLES.get(t, t) for t in column[len("cos_") :].split("_"))
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
        # over all pairs seen, so the title matches the metrics file.
        overall = steps.conflicts.sum() / steps.pairs.sum()
        cos_ax.set_title(
            f"{entry['label']}: {overall:.1%} of task-gradient pairs conflict", fontsize="medium"
        )
        summary.append(f"`{entry['config']}` {overall:.3f}")
        cos_ax.set_ylabel("gradient cosine")
        cos_ax.legend(fontsize="small")
        frac_ax.plot(steps.step, steps.conflicts.cumsum() / steps.pairs.cumsum())
        frac_ax.set_ylim(0.0, 1.0)
        frac_ax.set_ylabel("conflicting pairs so far")
        frac_ax.set_title(f"running conflict fraction (overall {overall:.3f})", fontsize="medium")
    axes[-1][0].set_xlabel("training step")
    axes[-1][1].set_xlabel("training step")
    return "Overall fraction of conflicting task-gradient pairs: " + "; ".join(summary) + "."


# Each draws onto an empty figure and returns extra caption text for the README
# (numbers a reader should not have to read off the plot), or "".
DRAW = {"loss": _draw_loss, "average": _draw_average, "conflicts": _draw_conflicts}


def draw_figure(spec: dict, multitask_dir: Path, path: Path) -> str:
    """Draw one figure to a PNG file whose bytes depend only on the data; return extra caption."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    height = {"loss": 4.0, "average": 4.0}.get(spec["kind"], 3.2 * len(spec["configs"]))
    width = {"average": 7.0}.get(spec["kind"], 13.0)
    # The default style, not the user's matplotlibrc, so every machine draws alike.
    # The hash salt only matters for SVG output; fixed so that would be stable too.
    with matplotlib.style.context("default"), matplotlib.rc_context({"svg.hashsalt": "minbert"}):
        # A bare Figure on the Agg canvas: no pyplot global state, no GUI backend.
        fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        extra = DRAW[spec["kind"]](fig, spec, multitask_dir)
        fig.suptitle(spec["title"])
        # PNG metadata would otherwise carry the matplotlib version; no timestamps are
        # written, so equal data gives byte-identical files.
        fig.savefig(path, format="png", metadata={"Software": None})
    return extra


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
    extra = draw_figure(spec, multitask_dir, out_dir / spec["file"])
    # Semicolons: the labels themselves contain commas.
    compared = "; ".join(f"{e['label']} (`{e['config']}`)" for e in spec["configs"])
    caption = f"{spec['caption'].strip()} Configurations: {compared}."
    lines += [f"![{spec['title']}]({spec['file']})", "", f"{caption} {extra}".strip()]
    return "\n".join(lines)
