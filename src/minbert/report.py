"""The report: the paper's tables and figures regenerated from this pipeline's metrics files.

Every number in the report is read from a metrics file that a pipeline stage
wrote; the report says which checkpoint, data split, seed, scale and device produced
it, and sets the published numbers (``reference/paper.yaml``) beside it.

What each table and figure shows (which configurations, in which order, with which
labels) is data in ``reference/paper.yaml``, so adding a row or a figure needs no
change here. A configuration that was not run shows as "not run" in a table, and a
figure whose inputs are missing is replaced by a line naming the missing files:
a partial pipeline still gets a report. Only having no metrics at all is an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from minbert.atomic import atomic_directory

TASK_NAMES = {"sst": "SST (5 classes)", "cfimdb": "CFIMDB (2 classes)"}
MODE_NAMES = {"last-layer": "last layer only", "full": "full fine-tuning"}

# The three multitask tasks: key in paper.yaml, key in the metrics file, column title.
MULTITASK_COLUMNS = [
    ("sst", "sst_accuracy", "SST acc"),
    ("quora", "quora_accuracy", "Quora acc"),
    ("sts", "sts_pearson", "STS Pearson"),
]
TASK_TITLES = {"sst": "SST", "quora": "Quora", "sts": "STS"}
MULTITASK_TABLES = ["table2", "table3", "table4"]
FIGURE_KINDS = ("loss", "average", "conflicts")

# A published number the source lacks (null in paper.yaml).
NO_PAPER_NUMBER = "—"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def load_metrics(directory: Path) -> list[dict]:
    # A directory that does not exist (stage never run) simply has no metrics.
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]


# ----------------------------------------------------------------------------- Table 1


def table1(metrics: list[dict], paper: dict) -> str:
    """Markdown for Table 1 plus a provenance list for its numbers."""
    by_cell = {(m["task"], m["mode"]): m for m in metrics}
    header = ["Task"]
    for mode_name in MODE_NAMES.values():
        header += [f"{mode_name} (ours)", f"{mode_name} (reference)"]
    lines = [f"| {' | '.join(header)} |", "|" + "---|" * len(header)]
    for task, name in TASK_NAMES.items():
        row = [name]
        for mode in MODE_NAMES:
            ours = by_cell.get((task, mode))
            row += [_fmt(ours["dev_accuracy"]) if ours else "not run",
                    _fmt(paper["rows"].get(task, {}).get(mode))]
        lines.append(f"| {' | '.join(row)} |")
    notes = ["", "How each of our numbers was produced:", ""]
    if not by_cell:
        notes.append("- no sentiment metrics: the `sentiment` stage has not been run.")
    for m in sorted(by_cell.values(), key=lambda m: (m["task"], m["mode"])):
        ck = m["checkpoint"]
        notes.append(
            f"- `{m['run']}`: dev accuracy {m['dev_accuracy']:.4f} at epoch {m['best_epoch']} of "
            f"{m['epochs']} (best dev epoch); {m['train_examples']} training examples "
            f"({m['data_split']}), {m['dev_examples']} dev examples; lr {m['lr']}, batch "
            f"{m['batch_size']}, {m['optimizer']}, pooling `{m['pooling']}`; checkpoint `{ck['name']}` "
            f"({ck['weights']} sha256 {ck['sha256'][:12]}…); seed {m['seed']}; scale "
            f"`{m['scale']}`; device {m['device']}."
        )
    notes += ["", f"Reference column: {paper['source']}"]
    return "\n".join(lines + notes)


# ----------------------------------------------------------------------------- Tables 2-4


def load_multitask(directory: Path) -> dict[str, dict]:
    """The multitask metrics files, keyed by configuration name."""
    return {m["config"]: m for m in load_metrics(directory)}


def _paper_cell(paper: dict | None, task: str) -> str:
    value = None if paper is None else paper.get(task)
    return NO_PAPER_NUMBER if value is None else f"{value:.3f}"


def _paper_average(paper: dict | None) -> str:
    # The plain mean, the multitask stage's definition of `average`, so the two
    # average columns are comparable; only when all three numbers are published.
    values = [None if paper is None else paper.get(task) for task, _, _ in MULTITASK_COLUMNS]
    if any(v is None for v in values):
        return NO_PAPER_NUMBER
    return f"{sum(values) / len(values):.3f}"


def _per_task(counts: dict) -> str:
    return ", ".join(f"{TASK_TITLES.get(t, t)} {n}" for t, n in counts.items())


def _provenance(m: dict) -> str:
    """One line saying how a multitask configuration's numbers were produced."""
    ck, s = m["checkpoint"], m["settings"]
    smart = "on" if s.get("smart") else "off"
    line = (
        f"- `{m['config']}`: best dev average at epoch {m['best_epoch']} of {m['epochs']}; "
        f"training examples {_per_task(m['train_examples'])}; dev examples "
        f"{_per_task(m['dev_examples'])}; paraphrase head `{s['paraphrase_head']}`, STS head "
        f"`{s['sts_head']}`, gradient `{s['gradient']}`, optimizer {s['optimizer']} lr {s['lr']}, "
        f"batch {_per_task(m['batch_size'])}, SMART {smart}, pooling `{s['pooling']}`; "
        f"checkpoint `{ck['name']}` "
        f"({ck['weights']} sha256 {ck['sha256'][:12]}…); seed {m['seed']}; scale `{m['scale']}`; "
        f"device {m['device']}."
    )
    if "pcgrad_conflict_fraction" in m:
        line = line[:-1] + f"; PCGrad conflict fraction {m['pcgrad_conflict_fraction']:.3f}."
    return line


def _quora_notes(runs: list[dict]) -> list[str]:
    """The Quora split under a table: a warning for each carved split, else a plain note."""
    carved: dict[str, list[str]] = {}   # note text -> configurations it applies to
    official = []
    for m in runs:
        split = m["data_split"]["quora"]
        kind = split.get("kind") if isinstance(split, dict) else split
        if kind == "official":
            official.append(m["config"])
        else:
            note = split.get("note", kind) if isinstance(split, dict) else str(split)
            carved.setdefault(note, []).append(m["config"])
    lines = []
    for note, configs in carved.items():
        # Bold and first under the table: Quora numbers from a carved split must not
        # be read as comparable with the paper's (official split) column.
        lines.append(
            f"> **Warning:** the Quora numbers of {', '.join(f'`{c}`' for c in configs)} are NOT "
            f"on the official Quora split. {note}")
    if official:
        lines.append(f"Quora split of {', '.join(f'`{c}`' for c in official)}: the official "
                     "course train / dev split.")
    return lines


def multitask_table(spec: dict, runs: dict[str, dict]) -> str:
    """Markdown for one of Tables 2-4: ours beside the paper's, then where ours came from."""
    header = ["Configuration"]
    for _, _, title in MULTITASK_COLUMNS:
        header += [f"{title} (ours)", f"{title} (paper)"]
    header += ["Average (ours)", "Average (paper)"]
    lines = [f"| {' | '.join(header)} |", "|" + "---|" * len(header)]
    row_notes = []
    for row in spec["rows"]:
        config, paper = row["config"], row.get("paper")
        # A "|" in a label (e.g. |u − v|) would end the Markdown cell early.
        label = f"{row['label']} (`{config}`)".replace("|", "\\|")
        if row.get("note"):
            # Footnote marks keep a long source note out of the table itself.
            row_notes.append(row["note"])
            label += f" [{len(row_notes)}]"
        ours = runs.get(config)
        cells = [label]
        for task, key, _ in MULTITASK_COLUMNS:
            cells += [_fmt(ours[key]) if ours else "not run", _paper_cell(paper, task)]
        cells += [_fmt(ours["average"]) if ours else "not run", _paper_average(paper)]
        lines.append(f"| {' | '.join(cells)} |")

    present = [runs[c] for c in dict.fromkeys(r["config"] for r in spec["rows"]) if c in runs]
    notes = [""]
    if present:
        notes += _quora_notes(present) + ["", "How each of our numbers was produced:", ""]
        notes += [_provenance(m) for m in present]
    else:
        notes.append("None of this table's configurations has been run (stage `multitask`).")
    notes += ["", (f"Paper column: {spec['source']} Averages are the plain mean of the three "
                   "task numbers, ours and the paper's alike.")]
    if row_notes:
        notes += [""] + [f"- [{i}] {note}" for i, note in enumerate(row_notes, start=1)]
    return "\n".join(lines + notes)


# ----------------------------------------------------------------------------- figures


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
    tasks = [task for task, _, _ in MULTITASK_COLUMNS]
    axes = fig.subplots(1, len(tasks))
    colours = [f"C{i}" for i in range(len(spec["configs"]))]
    for entry, colour in zip(spec["configs"], colours):
        history = _read_csv(multitask_dir / f"{entry['config']}-history.csv",
                            ["epoch"] + [f"{k}_loss_{t}" for t in tasks for k in ("train", "dev")])
        for ax, task in zip(axes, tasks):
            ax.plot(history.epoch, history[f"train_loss_{task}"], color=colour, marker="o",
                    label=f"{entry['label']}, train")
            ax.plot(history.epoch, history[f"dev_loss_{task}"], color=colour, marker="o",
                    linestyle="--", label=f"{entry['label']}, dev")
    for ax, task in zip(axes, tasks):
        ax.set_title(TASK_TITLES[task])
        ax.set_xlabel("epoch")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].set_ylabel("loss")
    axes[0].legend(fontsize="small")
    return ""


def _draw_average(fig, spec: dict, multitask_dir: Path) -> str:
    ax = fig.subplots()
    for entry in spec["configs"]:
        history = _read_csv(multitask_dir / f"{entry['config']}-history.csv", ["epoch", "average"])
        ax.plot(history.epoch, history.average, marker="o", label=entry["label"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("dev average")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize="small")
    return ""


def _draw_conflicts(fig, spec: dict, multitask_dir: Path) -> str:
    axes = fig.subplots(len(spec["configs"]), 2, squeeze=False)
    summary = []
    for (cos_ax, frac_ax), entry in zip(axes, spec["configs"]):
        steps = _read_csv(multitask_dir / f"{entry['config']}-conflicts.csv",
                          ["step", "conflicts", "pairs"])
        # Per-step cosines are noisy: drawn faintly, with a moving average on top
        # (about 50 windows per run) so the trend stays readable at any run length.
        window = max(1, len(steps) // 50)
        for k, column in enumerate(c for c in steps.columns if c.startswith("cos_")):
            pair = " · ".join(TASK_TITLES.get(t, t) for t in column[len("cos_"):].split("_"))
            cos_ax.plot(steps.step, steps[column], color=f"C{k}", linewidth=0.5, alpha=0.3)
            cos_ax.plot(steps.step, steps[column].rolling(window, min_periods=1).mean(),
                        color=f"C{k}", linewidth=1.5, label=f"{pair} (mean of {window} steps)")
        cos_ax.axhline(0.0, color="black", linewidth=0.6)
        # Same definition as the stage's pcgrad_conflict_fraction: conflicting pairs
        # over all pairs seen, so the title matches the metrics file.
        overall = steps.conflicts.sum() / steps.pairs.sum()
        cos_ax.set_title(f"{entry['label']}: {overall:.1%} of task-gradient pairs conflict",
                         fontsize="medium")
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
        lines.append(f"Not drawn: missing metrics {', '.join(missing)} "
                     "(run the `multitask` stage for these configurations).")
        return "\n".join(lines)
    extra = draw_figure(spec, multitask_dir, out_dir / spec["file"])
    # Semicolons: the labels themselves contain commas.
    compared = "; ".join(f"{e['label']} (`{e['config']}`)" for e in spec["configs"])
    caption = f"{spec['caption'].strip()} Configurations: {compared}."
    lines += [f"![{spec['title']}]({spec['file']})", "", f"{caption} {extra}".strip()]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the report


def _check_paper(paper: dict) -> None:
    """Fail early, naming the entry, on a paper.yaml the report cannot read."""
    for name in MULTITASK_TABLES:
        for i, row in enumerate(paper.get(name, {}).get("rows", [])):
            if not isinstance(row, dict) or "config" not in row or "label" not in row:
                raise ValueError(f"paper.yaml {name}.rows[{i}]: needs `config` and `label`")
    for i, spec in enumerate(paper.get("figures", [])):
        if spec.get("kind") not in FIGURE_KINDS:
            raise ValueError(f"paper.yaml figures[{i}]: kind must be one of {', '.join(FIGURE_KINDS)}")
        for key in ("file", "title", "caption", "configs"):
            if key not in spec:
                raise ValueError(f"paper.yaml figures[{i}]: missing `{key}`")


def write_report(metrics_dir: Path, paper_file: Path, out_dir: Path) -> None:
    metrics_dir = Path(metrics_dir)
    paper = yaml.safe_load(Path(paper_file).read_text(encoding="utf-8"))
    _check_paper(paper)
    sentiment = load_metrics(metrics_dir / "sentiment")
    multitask_dir = metrics_dir / "multitask"
    multitask = load_multitask(multitask_dir)
    if not sentiment and not multitask:
        raise FileNotFoundError(
            f"no metrics files to report: neither {metrics_dir}/sentiment nor {multitask_dir} "
            "holds any *.json (run the `sentiment` or `multitask` stages first)")

    sections = [
        "# minbert results",
        "",
        "Generated by `dvc repro` (stage `report`) from the files under `metrics/`;",
        "do not edit by hand.",
        "",
        f"## Table 1: {paper['table1']['title']}",
        "",
        table1(sentiment, paper["table1"]),
        "",
    ]
    for number, name in enumerate(MULTITASK_TABLES, start=2):
        if name in paper:
            sections += [f"## Table {number}: {paper[name]['title']}", "",
                         multitask_table(paper[name], multitask), ""]

    sections += ["## MLM pretraining before fine-tuning", "", mlm_section(metrics_dir, multitask), ""]

    with atomic_directory(out_dir) as tmp:
        if paper.get("figures"):
            sections += ["## Figures", ""]
            # Shown as given (e.g. metrics/multitask), so the README names the files
            # as the repository does and does not depend on where it was built.
            display_dir = multitask_dir.as_posix()
            for spec in paper["figures"]:
                sections += [figure_section(spec, multitask_dir, display_dir, tmp), ""]
        (tmp / "README.md").write_text("\n".join(sections), encoding="utf-8")


# ----------------------------------------------------------------------------- MLM


def mlm_section(metrics_dir: Path, multitask: dict[str, dict]) -> str:
    """Pretraining metrics, then each fine-tuning run with and without the MLM stage."""
    pretraining = {m["start"]: m for m in load_metrics(metrics_dir / "mlm")}
    tuned = load_metrics(metrics_dir / "multitask-mlm")
    if not pretraining:
        return ("MLM pretraining was not run with these parameters (`mlm.pretrain` is empty). "
                "Switch it on with `dvc exp run -S 'mlm.pretrain=[continue]'` (or `[scratch]`, "
                "or both); the configurations in `mlm.finetune` are then fine-tuned a second "
                "time from the pretrained checkpoint and shown here beside the first.")
    lines = ["| MLM start | masked-token accuracy before | after | perplexity before | after "
             "| training sequences | held-out sequences |", "|---|---|---|---|---|---|---|"]
    for start, m in pretraining.items():
        b, a, c = m["before"], m["after"], m["corpus"]
        lines.append(f"| `{start}` | {b['masked_accuracy']:.3f} | {a['masked_accuracy']:.3f} | "
                     f"{b['perplexity']:.1f} | {a['perplexity']:.1f} | {c['train_sequences']} | "
                     f"{c['heldout_sequences']} |")
    lines += ["", "Masked-token accuracy and perplexity are measured on held-out sequences of the "
              "training text (masks drawn once, the same positions before and after); "
              "no dev or test text is in the pretraining corpus.", ""]
    header = ["Configuration", "Fine-tuned from"] + [t for _, _, t in MULTITASK_COLUMNS] + ["Average"]
    lines += [f"| {' | '.join(header)} |", "|" + "---|" * len(header)]
    notes = []
    for m in sorted(tuned, key=lambda m: (m["config"], m["pretraining"]["start"])):
        # The same configuration without MLM, from the `multitask` stage, when it ran.
        base = multitask.get(m["config"])
        rows = [(base, f"`{base['checkpoint']['name']}`")] if base else []
        rows.append((m, f"`{m['checkpoint']['name']}`"))
        for run, origin in rows:
            cells = [f"`{m['config']}`", origin] + [_fmt(run[key]) for _, key, _ in MULTITASK_COLUMNS]
            lines.append(f"| {' | '.join(cells + [_fmt(run['average'])])} |")
        notes.append(_provenance(m))
    return "\n".join(lines + ["", "How the fine-tuning numbers after MLM were produced:", ""] + notes)
