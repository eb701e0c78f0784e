"""The report's first screen, which the README's results block repeats: ours beside the
paper's headline numbers (Table 2's rows that have all four published numbers, Table 1's
arms), the budget ours were made at, and what that budget can and cannot show."""

from __future__ import annotations

from minbert.report.comparisons import VERDICTS, Compared, SeedRuns
from minbert.report.controls import Starts
from minbert.report.formatting import (
    COLUMN_TITLES,
    COLUMNS,
    MODE_NAMES,
    fmt,
    md_header,
    md_row,
    per_task,
)
from minbert.report.notes import epoch_count, row_title, usual
from minbert.runs.gpu_calls import GpuProvenance
from minbert.tasks import AVERAGE, SENTIMENT_TASKS, TASKS


def beside_the_paper(
    runs: dict[str, dict],
    sentiment: list[dict],
    paper: dict,
    gpu_runs: dict[str, dict] | None = None,
    gpu_sentiment: list[dict] | None = None,
    gpu_provenance: GpuProvenance | None = None,
    gpu_stale: dict[str, list[str]] | None = None,
    seed_study: SeedRuns | None = None,
) -> tuple[list[str], str]:
    """The two tables (Table 2's rows with all four published numbers, each the paper's
    then ours, the mean over ``seed_study``'s seeds where it has them, then ours at the
    `gpu` scale where ``metrics/gpu`` has it, with the commit it ran at and whether its
    code changed since, ``gpu_stale``; Table 1's arms) as markdown lines, and the sentence
    that says what each was made at."""
    gpu_runs, gpu_sentiment, gpu_stale = gpu_runs or {}, gpu_sentiment or [], gpu_stale or {}

    def on_gpu_label(stages: list[str]) -> str:
        known = [s for s in stages if gpu_provenance and s in gpu_provenance.stages]
        commits = sorted({gpu_provenance.ran_at(s) for s in known})
        stale = ", stale" if any(gpu_stale.get(s) for s in stages) else ""
        return f"ours on a GPU ({', '.join(commits)}{stale})" if commits else "ours on a GPU"

    shown = [
        row
        for row in paper["table2"]["rows"]
        if row["config"] in runs and all((row.get("paper") or {}).get(c) is not None for c in COLUMNS)
    ]
    multitask = md_header(["dev sets", *(COLUMN_TITLES[c] for c in COLUMNS)])
    for row in shown:
        name = f"`{row['config']}`"
        multitask.append(md_row([f"{name}, the paper", *(fmt(row["paper"][c]) for c in COLUMNS)]))
        run = runs[row["config"]]  # the tables' seed's run
        multitask.append(md_row([f"{name}, ours (seed {run.seed})", *(fmt(run.scores[c]) for c in COLUMNS)]))
        means = seed_study.means(row["config"]) if seed_study else None
        if means is not None:  # as the report's Tables 2-4 give it
            count = len(seed_study.configs[row["config"]])
            multitask.append(
                md_row([f"{name}, ours (mean over {count} seeds)", *(fmt(means[c]) for c in COLUMNS)])
            )
        if row["config"] in gpu_runs:
            on_gpu = gpu_runs[row["config"]]
            label = f"{name}, {on_gpu_label(['multitask@' + row['config']])}"
            multitask.append(md_row([label, *(fmt(on_gpu.scores[c]) for c in COLUMNS)]))

    published = next(r for r in paper["table1"]["references"] if r["name"] == "paper")["rows"]
    arms = [(task, mode) for task in SENTIMENT_TASKS for mode in MODE_NAMES]
    ours = {(m.task, m.mode): m for m in sentiment}
    single = md_header(
        ["single task, dev accuracy", *(f"{TASKS[t].title}, {MODE_NAMES[m]}" for t, m in arms)]
    )
    single.append(md_row(["the paper", *(fmt(published.get(t, {}).get(m)) for t, m in arms)]))
    single.append(md_row(["ours", *(fmt(ours[arm].accuracy if arm in ours else None) for arm in arms)]))
    if gpu_sentiment:
        on_gpu = {(m.task, m.mode): m.accuracy for m in gpu_sentiment}
        label = on_gpu_label([f"sentiment@{m.run}" for m in gpu_sentiment])
        single.append(md_row([label, *(fmt(on_gpu.get(arm)) for arm in arms)]))

    used = {row["config"]: runs[row["config"]] for row in shown}
    checkpoint = usual({n: f"`{m.checkpoint.name}`" for n, m in used.items()})
    scale = usual({n: f"`{m.scale}`" for n, m in used.items()})
    sizes = usual({n: per_task(m.train_examples) for n, m in used.items()})
    epochs = usual({n: epoch_count(m.epochs) for n, m in used.items()})
    seeds = usual({n: str(m.seed) for n, m in used.items()})
    full = [(t, ours[(t, "full")].train_examples) for t in SENTIMENT_TASKS if (t, "full") in ours]
    reviews = ", ".join(f"{TASKS[t].title} {n:,}" for t, n in full)
    labels = []
    for row in shown:
        title, differs = row_title(row, runs[row["config"]])
        labels.append(f'`{row["config"]}` "{row["label"]}"' + (f" (ours ran as {title})" if differs else ""))
    labels = ", ".join(labels)
    quora = _carved_quora(used)
    if seed_study:  # Tables 2-4 and the README's rows give the mean over these too
        others = ", ".join(map(str, seed_study.seeds))
        seeds += f" (a mean over {len(seed_study.seeds) + 1} seeds adds the seed study's {others})"
    prose = (
        f"Rows of the paper's Table 2 ({labels}). Ours: {checkpoint} fine-tuned at the {scale} "
        f"scale ({sizes} training examples per task, {epochs}, seed {seeds}"
        + (f"; single task: {reviews} training examples" if reviews else "")
        + f"), scored on the full dev sets; the paper: {paper['setup']['summary']}."
        + (
            f" Our Quora dev set is a held-out part of the course's labelled `quora-dev.csv` "
            f"({quora:,} pairs), not the official split."
            if quora
            else ""
        )
    )
    shown_on_gpu = [f"multitask@{row['config']}" for row in shown if row["config"] in gpu_runs]
    shown_on_gpu += [f"sentiment@{m.run}" for m in gpu_sentiment]
    stale = ""
    if any(gpu_stale.get(s) for s in shown_on_gpu):
        stale = (
            " A GPU row marked stale ran at an earlier commit, and code its stages depend on has "
            "changed since (report/gpu.md names the commit and the files): it stands until a call "
            "runs it again (`minbert gpu-status`)."
        )
    return [*multitask, "", *single], prose + _on_gpu(gpu_runs, gpu_sentiment) + stale


def _on_gpu(runs: dict[str, dict], sentiment: list[dict]) -> str:
    """What the rows "ours on a GPU" were made at, from their run records."""
    made = [*runs.values(), *sentiment]
    if not made:
        return ""
    device = usual({m.name: m.offline_run.device for m in made})
    what = "the single-task runs"
    if runs:
        checkpoint = usual({n: f"`{m.checkpoint.name}`" for n, m in runs.items()})
        sizes = usual({n: per_task(m.train_examples) for n, m in runs.items()})
        epochs = usual({n: epoch_count(m.epochs) for n, m in runs.items()})
        seed = usual({n: str(m.seed) for n, m in runs.items()})
        what = f"{checkpoint} fine-tuned ({sizes} training examples per task, {epochs}, seed {seed})"
    return (
        f" Ours on a GPU: {what} at the `gpu` scale on {device}; a row without it has not run "
        "there yet (report/gpu.md)."
    )


def _carved_quora(runs: dict[str, dict]) -> int | None:
    """The held-out Quora pairs, when the runs' Quora dev set was carved from the course's
    labelled file (no official train split); None otherwise."""
    carved = [m.data_split.quora.heldout_pairs for m in runs.values() if m.data_split.quora.carved]
    return max(carved) if carved else None


def what_it_can_show(compared: list[Compared], starts: Starts) -> str:
    """Whether fine-tuning moved each run from where it started, then each comparison of
    Tables 2-4 on the average with its one verdict (the record the tables' marks render)."""
    started = []
    if starts.own:
        started.append(
            "Fine-tuning against where it started, every configuration and column on dev (paired "
            f"intervals): {starts.counted()}. {starts.over_seeds_said()}".strip()
        )
    if not compared:
        return "\n\n".join([*started, "No comparison of Tables 2-4 has both rows run."])
    order = {v: i for i, v in enumerate(VERDICTS)}
    lines = [
        "Each comparison of Tables 2-4 on the average for the tables' own seed, with its one "
        "verdict (marked on tables.md: bold shown, † not confirmed by the seeds, ‡ budgets "
        'differ, unmarked within dev noise; its "How to read the tables" says how each is '
        "reached):",
        "",
        *(c.sentence([AVERAGE]) for c in sorted(compared, key=lambda c: order[c.verdict()])),
    ]
    return "\n\n".join([*started, "\n".join(lines)])
