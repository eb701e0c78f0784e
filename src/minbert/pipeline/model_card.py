"""The model card of a fine-tuned multitask model: ``README.md`` in its directory, in the
style of a Hugging Face model card (metadata, what it is, its data and scale, its dev
scores with intervals, how to load it), written from the run's typed record
(``minbert.pipeline.run_record``)."""

from __future__ import annotations

import re

import numpy as np

from minbert.data.batches import TokenizedTable
from minbert.metrics import BOOTSTRAP_RESAMPLES, CONFIDENCE, Interval, average_interval, interval
from minbert.pipeline.run_record import MultitaskRun
from minbert.runs.record_parts import schedule_words
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS

MODEL_CARD = "README.md"
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def dev_intervals(result, tables: dict[tuple[str, str], TokenizedTable]) -> dict[str, Interval]:
    """Each task's dev score and the average with their bootstrap intervals, computed as
    the report computes them (Quora's question groups resampled whole)."""
    parts = []
    out = {}
    for task in MULTITASK_TASKS:
        table = tables[task, "dev"]
        predicted = np.asarray(result.dev_predictions[task], float)
        out[task] = interval(task, table.labels, predicted, groups=table.groups)
        parts.append((task, table.labels, predicted, table.groups))
    out[AVERAGE] = average_interval(parts)
    return out


def _per_task(counts: dict) -> str:
    return ", ".join(f"{TASKS[t].title} {n:,}" for t, n in counts.items())


def model_card(name: str, run: MultitaskRun, intervals: dict[str, Interval], directory: str) -> str:
    """The card's Markdown; ``directory``: where the model lies, as its commands name it."""
    s, ck = run.settings, run.checkpoint
    schedule = schedule_words(s.lr_schedule, s.lr_gamma, s.epochs)
    quora = run.data_split["quora"]
    trained_on = ck.get("training_data")
    rows = [
        f"| {TASKS[t].metric_title} | {iv.value:.4f} | [{iv.low:.4f}, {iv.high:.4f}] "
        f"| {run.dev_examples[t]:,} |"
        for t, iv in ((t, intervals[t]) for t in MULTITASK_TASKS)
    ]
    average = intervals[AVERAGE]
    rows.append(f"| Average | {average.value:.4f} | [{average.low:.4f}, {average.high:.4f}] | |")
    lines = [
        "---",
        "library_name: minbert",
        "pipeline_tag: text-classification",
        "language: en",
        "tags: [bert, multitask, sentiment, paraphrase, semantic-similarity]",
        # A hub name only (a packaged alias or a local directory is no hub model).
        *([f"base_model: {ck['name']}"] if HUB_NAME.match(ck["name"]) else []),
        "---",
        "",
        f"# minbert multitask model `{name}`",
        "",
        f"A BERT encoder (`{ck['name']}`, {ck['weights']} sha256 {ck['sha256'][:12]}…) fine-tuned "
        "with three task heads sharing it: SST 5-class sentiment, Quora paraphrase detection "
        "and STS similarity (0–5), by the minbert pipeline "
        f"(`dvc repro`, stage `multitask@{run.context.name}`).",
        "",
        "## Training",
        "",
        f"- Heads: paraphrase `{s.paraphrase_head}`, STS `{s.sts_head}` (output "
        f"`{s.sts_output}`), pooling `{s.pooling}`, dropout {s.dropout}.",
        f"- Steps: `{s.gradient}`; {s.optimizer} lr {s.lr:g} (heads {s.head_lr:g}), "
        f"{schedule}, weight decay {s.weight_decay}; SMART {'on' if s.smart else 'off'}.",
        f"- Data: training examples {_per_task(run.train_examples)}; batch "
        f"{_per_task(s.batch_size)}; validation split {_per_task(run.validation_examples)} "
        "(set aside from the training rows; it chose the epoch).",
        f"- Epoch {run.best_epoch} of {s.epochs} kept, after {run.optimizer_steps:,} optimizer "
        f"steps; seed {s.seed}; scale `{run.context.scale}`; device {run.device}.",
    ]
    if quora.get("kind") != "official":
        sizes = (
            f" ({quora['train_pairs']:,} / {quora['heldout_pairs']:,} pairs, no question on both sides)"
            if {"train_pairs", "heldout_pairs"} <= set(quora)
            else ""
        )
        lines.append(
            "- Quora: Quora's official training split was not available; training and dev pairs "
            f"are both carved out of the course's quora-dev.csv{sizes}, so its Quora score is "
            "not comparable with results on the official Quora dev set."
        )
    if trained_on:
        overlap = ", ".join(
            f"`{o['dataset']}` ({TASKS[o['task']].name})" for o in trained_on["course_overlap"]
        )
        lines.append(
            f"- The checkpoint was trained for sentence similarity on {trained_on['examples']:,} "
            f"examples from {trained_on['datasets']} datasets before this fine-tuning"
            + (f", among them {overlap}" if overlap else "")
            + "."
        )
    lines += [
        "",
        "## Dev results",
        "",
        f"Full dev sets, each score with its {CONFIDENCE:.0%} bootstrap interval over the dev "
        f"examples ({BOOTSTRAP_RESAMPLES:,} resamples; Quora resamples whole question groups).",
        "",
        "| Task | Score | Interval | Examples |",
        "|---|---|---|---|",
        *rows,
        "",
        "## How to use",
        "",
        "```bash",
        f'minbert predict {directory} --task sts --pair "A man plays a guitar." "Someone plays music."',
        f"minbert evaluate {directory} --task quora data/prepared/quora-dev.parquet",
        "```",
        "",
        "The encoder alone is a Hugging Face BERT directory (`config.json`, `model.safetensors`, "
        f'`vocab.txt`): `transformers.BertModel.from_pretrained("{directory}")` loads it. The task '
        "heads are in `heads.safetensors`, described by `minbert.json`; "
        "`minbert.model.multitask.load_multitask` loads encoder and heads.",
        "",
    ]
    return "\n".join(lines)
