"""The report's provenance: what its numbers were made with, said once: the setup at a
glance beside the paper's, the notes that colour every table (which Quora split, what
the checkpoint was trained on), and one table of how each run was produced."""

from __future__ import annotations

from collections.abc import Callable

from minbert.metrics import DECIMALS
from minbert.report.comparisons import fmt_budget
from minbert.report.formatting import NO_NUMBER, md_header, md_row, per_task
from minbert.report.notes import rates, usual
from minbert.runs.training import MultitaskRunFile, SentimentRunFile
from minbert.tasks import TASKS


def _each(runs: dict[str, dict], value: Callable[[dict], str]) -> str:
    return usual({name: value(m) for name, m in runs.items()}) if runs else NO_NUMBER


def _batch(run: MultitaskRunFile) -> str:
    several = f", {run.batches_per_step} batches a step" if run.batches_per_step else ""
    return per_task(run.batch_size) + several


def _sentiment(runs: list[dict]) -> str:
    """The sentiment runs' sizes, per task: training examples, batch, epochs per mode."""
    by_task: dict[str, list[dict]] = {}
    for m in runs:
        by_task.setdefault(m.task, []).append(m)
    parts = []
    for task, ms in by_task.items():
        epochs = ", ".join(f"{m.epochs} {m.mode}" for m in sorted(ms, key=lambda m: m.mode))
        parts.append(
            f"{TASKS[task].title} {ms[0].train_examples:,} examples, batch {ms[0].batch_size}, "
            f"epochs {epochs}"
        )
    return "; ".join(parts) or "not run"


def setup_section(
    runs: dict[str, dict],
    sentiment: list[dict],
    seed_study: dict | None,
    paper: dict,
) -> list[str]:
    """The setup table (these runs beside the paper's ``setup`` in paper.yaml), then the
    Quora and checkpoint notes, once for every table."""
    dev = dict(next(iter(runs.values())).dev_examples) if runs else {}
    dev.update({m.task: m.dev_examples for m in sentiment})
    seeds = _each(runs, lambda m: str(m.seed)) + " (every run of tables.md and Table 1)"
    if seed_study:
        seeds += (
            f"; {', '.join(map(str, seed_study.seeds))} besides it (the seed study: the first "
            "page's Tables 2-4 give the mean over all of them)"
        )
    rows = [
        ("Checkpoint", _each(runs, lambda m: f"`{m.checkpoint.name}`"), paper["checkpoint"]),
        (
            "What the heads read",
            _each(runs, lambda m: f"`{m.settings.pooling}` pooling"),
            paper["pooling"],
        ),
        (
            "Multitask training examples per task",
            _each(runs, lambda m: per_task(m.train_examples)),
            per_task({t: f"{n:,}" for t, n in paper["train_examples"].items()}),
        ),
        (
            "Validation split (chooses the epoch)",
            _each(runs, lambda m: per_task(m.validation_examples)),
            paper["validation"],
        ),
        (
            "Multitask epochs; batch per task",
            _each(runs, lambda m: f"{m.epochs}; {_batch(m)}"),
            paper["multitask"],
        ),
        ("Sentiment runs (Table 1)", _sentiment(sentiment), paper["sentiment"]),
        (
            "Dev examples",
            per_task({t: f"{n:,}" for t, n in dev.items()}) or NO_NUMBER,
            per_task({t: f"{n:,}" for t, n in paper["dev_examples"].items()}),
        ),
        ("Seeds", seeds if runs else NO_NUMBER, paper["seeds"]),
        (
            "Device",
            _each({**runs, **{m.run: m for m in sentiment}}, lambda m: m.device),
            paper["device"],
        ),
    ]
    lines = md_header(["", "These runs", "The paper"])
    lines += [md_row([what, ours, theirs]) for what, ours, theirs in rows]
    for note in [*quora_notes(runs), *checkpoint_notes([*runs.values(), *sentiment])]:
        lines += ["", note]
    return lines


def quora_notes(runs: dict[str, dict]) -> list[str]:
    """The Quora split: a warning for a carved split, else a plain note."""
    carved: dict[str, list[str]] = {}
    official = []
    for name, m in runs.items():
        split = m.data_split.quora
        if split.kind == "official":
            official.append(name)
        else:
            carved.setdefault(split.note or split.kind, []).append(name)
    lines = []
    for note, names in carved.items():
        which = "every table's Quora number" if not official else ", ".join(f"`{c}`" for c in names)
        lines.append(f"> **Quora:** {which} is NOT on the official Quora split. {note}")
    if official:
        lines.append(
            f"Quora split of {', '.join(f'`{c}`' for c in official)}: the official course train / dev split."
        )
    return lines


def checkpoint_notes(runs: list[dict]) -> list[str]:
    """One note per checkpoint whose further training the runs record (from its
    training-data file); none for a checkpoint that was only pretrained."""
    notes, seen = [], set()
    for m in runs:
        ck = m.checkpoint
        data = ck.training_data
        base = ck.name.split(" + ")[0]  # an MLM-continued checkpoint keeps its base's record
        if not data or base in seen:
            continue
        seen.add(base)
        overlap = "; ".join(
            f"`{o.dataset}` ({o.examples:,} examples) from {TASKS[o.task].source}, "
            f"which the course's {TASKS[o.task].title} data also comes from"
            for o in data.course_overlap
        )
        notes.append(
            f"> **Checkpoint:** `{base}` was trained further, after its pretraining, on "
            f"{data.examples:,} examples from {data.datasets} datasets for sentence "
            f"similarity (its `{data.file}`)"
            + (f", among them {overlap}" if overlap else "")
            + ". Its paraphrase and similarity scores are those of an encoder already tuned to "
            "compare sentences, not of BERT's pretraining alone: the untrained row of Table 2 "
            "shows what it scores before any fine-tuning."
        )
    return notes


# ----------------------------------------------------------------------------- provenance


def _multitask_or(sentiment: Callable[[dict], str], multitask: Callable[[dict], str]):
    return lambda m: sentiment(m) if isinstance(m, SentimentRunFile) else multitask(m)


# What the provenance table says of each run: (column title, value). A column whose
# value every run shares becomes one line above the table instead.
PROVENANCE: list[tuple[str, Callable[[dict], str]]] = [
    ("Epoch kept", lambda m: f"{m.epoch} of {m.epochs}"),
    ("Optimizer steps / examples seen", fmt_budget),
    (
        "Training examples",
        _multitask_or(lambda m: f"{m.train_examples:,}", lambda m: per_task(m.train_examples)),
    ),
    (
        "Validation examples",
        _multitask_or(lambda m: f"{m.validation_examples:,}", lambda m: per_task(m.validation_examples)),
    ),
    (
        "Optimizer",
        _multitask_or(
            lambda m: f"{m.optimizer} lr {m.lr:g}" + (f" (head {m.head_lr:g})" if m.head_lr != m.lr else ""),
            lambda m: rates(m.settings) + f", weight decay {m.settings.weight_decay:g}",
        ),
    ),
    ("Batch", _multitask_or(lambda m: str(m.batch_size), _batch)),
    (
        "Model",
        _multitask_or(
            lambda m: f"{TASKS[m.task].title} head, {m.mode}",
            lambda m: (
                f"pair heads `{m.settings.paraphrase_head}` / `{m.settings.sts_head}` "
                f"(STS output `{m.settings.sts_output}`), gradient `{m.settings.gradient}`, "
                f"SMART {'on' if m.settings.smart else 'off'}, dropout {m.settings.dropout}"
            ),
        ),
    ),
    (
        "PCGrad conflicts",
        lambda m: (
            f"{m.pcgrad_conflict_fraction:.3f}"
            if isinstance(m, MultitaskRunFile) and m.pcgrad_conflict_fraction is not None
            else NO_NUMBER
        ),
    ),
    (
        "Checkpoint",
        lambda m: f"`{m.checkpoint.name}` ({m.checkpoint.weights} sha256 {m.checkpoint.sha256[:12]}…)",
    ),
    ("Pooling", _multitask_or(lambda m: f"`{m.pooling}`", lambda m: f"`{m.settings.pooling}`")),
    ("Seed", lambda m: str(m.seed)),
    ("Scale", lambda m: f"`{m.scale}`"),
    ("Device", lambda m: m.device),
]


def provenance_section(runs: dict[str, dict], sentiment: list[dict]) -> list[str]:
    """One table of how each trained run was produced (``runs``: multitask runs by their
    display name; ``sentiment``: the Table 1 runs)."""
    rows = {**{f"`{m.run}`": m for m in sentiment}, **{f"`{n}`": m for n, m in runs.items()}}
    if not rows:
        return ["No run has been made yet."]
    values = {title: {n: value(m) for n, m in rows.items()} for title, value in PROVENANCE}
    common = [(t, next(iter(v.values()))) for t, v in values.items() if len(set(v.values())) == 1]
    varying = [t for t in values if len(set(values[t].values())) > 1]
    lines = []
    if common:
        lines += ["Every run: " + "; ".join(f"{t.lower()} {v}" for t, v in common) + ".", ""]
    lines += md_header(["Run", *varying])
    lines += [md_row([name, *(values[t][name] for t in varying)]) for name in rows]
    return lines


def cross_cpu_section(measurement: dict | None, source: str, current: dict[str, dict]) -> str:
    """How far another CPU's rounding moves the committed numbers: ``bench/cross_cpu.py``'s
    reruns of the multitask stages under another MKL branch (``measurement``: its result
    file), the largest difference being the tolerance below which no difference is read;
    ``current``: each configuration's metrics file now, which a rerun counts against only
    where it compared these same numbers."""
    rerun = "rerun `python bench/cross_cpu.py`"
    if measurement is None:
        return (
            f"Not measured: no rerun under another CPU's rounding has been committed (`{source}`; "
            "`bench/cross_cpu.py`), so read no difference at the last written digit as a finding."
        )
    found = measurement["results"]
    if "rounds_otherwise" not in found:
        return f"`{source}` is from an older bench that did not record what it compared with: {rerun}."
    configs = {c: r for c, r in found["configs"].items() if current.get(c) == r["committed"]}
    if not found["rounds_otherwise"]:
        branch = found["branch"]
        return f"`{source}`: `MKL_CBWR={branch}` rounds as the stages' own branch there: no check; {rerun}."
    if not configs:
        return f"`{source}` compared metrics files that have changed since: none is checked; {rerun}."
    identical = sum(r["identical"] for r in configs.values())
    moved = {
        (config, key): abs(rerun - committed)
        for config, r in configs.items()
        for key, (committed, rerun) in r["differences"].items()
        if isinstance(committed, float) and isinstance(rerun, float)
    }
    head = (
        f"Another CPU rounds the same matrix products otherwise in their last bits (MKL takes one "
        f"code path per vendor). Checked on one {measurement['machine']['cpu']} machine "
        f"({measurement['started'][:10]}) by retraining {len(configs)} configurations "
        f"({', '.join(f'`{c}`' for c in configs)}) with their stages' commands under "
        f"`MKL_CBWR={found['branch']}`, a branch that rounds a matrix product otherwise than the "
        f"stages' own (pinned) one there, as the bench checked (`{source}`, `bench/cross_cpu.py`): "
        f"{identical} of {len(configs)} metrics files identical to the committed ones at their "
        f"written precision ({DECIMALS} decimals)"
    )
    if moved:
        (config, key), largest = max(moved.items(), key=lambda kv: kv[1])
        head += (
            f"; the largest difference is {largest:.{DECIMALS}f} (`{config}` {key}): read no difference "
            "below it as a finding."
        )
    else:
        head += "."
    for words, names in (
        (
            "Rerun against numbers that have changed since, so not checked",
            [c for c in found["configs"] if c not in configs],
        ),
        ("Not rerun", [c for c in current if c not in found["configs"]]),
    ):
        head += f" {words}: {', '.join(f'`{c}`' for c in names)}." if names else ""
    return head
