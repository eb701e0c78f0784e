"""Phrases the report's sections share, and ``fill_facts``: the facts the prose of
``reference/paper.yaml`` names (``{smart}``, ``{steps best-round-robin}``) read from the
runs, so that no number there goes stale."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from minbert.report.formatting import per_task, span
from minbert.results import HISTORY, history_column, run_log
from minbert.runs.record_parts import RecordedSettings, schedule_words
from minbert.tasks import TASKS


def selection_note(runs: dict[str, dict], which: str) -> str:
    """What chose the epoch of each of ``runs`` (by name; ``which``: what they are), in its
    record's words (once when all agree)."""
    chosen: dict[str, list[str]] = {}
    for name, m in runs.items():
        chosen.setdefault(m.selection, []).append(f"`{name}`")
    if len(chosen) == 1:
        return f"The epoch of each {which}: {next(iter(chosen))}."
    return f"The epoch of each {which}: " + "; ".join(f"{', '.join(c)}: {s}" for s, c in chosen.items()) + "."


def rates(s: RecordedSettings) -> str:
    """A multitask run's optimizer, learning rates and schedule, from its settings; a
    decay per epoch that a one-epoch run never applies says so."""
    return _rates(s.optimizer, s.lr, s.head_lr, s.lr_schedule, s.lr_gamma, s.epochs)


def planned_rates(optimizer: str, spec: dict) -> str:
    """The same of an optimizer's entry in a scale of params.yaml (a scale not run)."""
    return _rates(optimizer, spec["lr"], spec.get("head_lr"), spec["lr_schedule"], spec.get("lr_gamma"), None)


def _rates(optimizer, lr, head_lr, schedule_name, gamma, epochs) -> str:
    schedule = schedule_words(schedule_name, gamma, epochs)
    heads = f" (heads {head_lr:g})" if head_lr is not None else ""
    return f"{optimizer} lr {lr:g}{heads}, {schedule}"


# What a row's settings say in words: the pair heads, how the tasks share a step, the
# optimizer, SMART (the keys a table row of reference/paper.yaml states under `stands_for`).
HEAD_WORDS = {
    "siamese-concat": "siamese concat(u, v)",
    "siamese-concat-diff": "siamese concat(u, v, |u − v|)",
    "siamese-concat-prod": "siamese concat(u, v, u ∗ v)",
    "siamese-concat-diff-prod": "siamese concat(u, v, |u − v|, u ∗ v)",
    "siamese-cosine": "cos-sim(u, v)",
    "cross-encoder": "sentence concatenation",
}
GRADIENT_WORDS = {"round-robin": "round-robin", "summed": "summed losses", "pcgrad": "PCGrad"}
OPTIMIZER_WORDS = {"adamw": "AdamW", "adamaxw": "AdamaxW"}
ROW_SETTINGS = ("paraphrase_head", "sts_head", "gradient", "optimizer", "smart")


def row_settings(settings: RecordedSettings) -> dict:
    """The run settings a table row's title speaks of (``ROW_SETTINGS``), SMART as on/off."""
    return {
        k: getattr(settings, k) is not None if k == "smart" else getattr(settings, k) for k in ROW_SETTINGS
    }


def in_words(settings: dict) -> str:
    """``row_settings`` as a row title: the heads, the steps, the optimizer, SMART."""
    quora, sts = HEAD_WORDS[settings["paraphrase_head"]], HEAD_WORDS[settings["sts_head"]]
    heads = quora if quora == sts else f"Quora {quora}, STS {sts}"
    smart = " + SMART" if settings["smart"] else ", no SMART"
    return f"{heads}, {GRADIENT_WORDS[settings['gradient']]}, {OPTIMIZER_WORDS[settings['optimizer']]}{smart}"


def row_title(row: dict, run: dict) -> tuple[str, str | None]:
    """A table row's title and a note: the paper's label where the run's record has the
    settings the row stands for (``stands_for``), else what the run was, in words, and a
    note naming each difference, so that no title names what its run did not do."""
    ran = row_settings(run.settings)
    differ = {k: v for k, v in row.get("stands_for", {}).items() if ran[k] != v}
    if not differ:
        return row["label"], None
    said = "; ".join(f"{k} {ran[k]} (the row stands for {v})" for k, v in differ.items())
    return in_words(ran), f'The paper\'s row is "{row["label"]}"; this run differs: {said}.'


# ----------------------------------------------------------------------------- facts


def usual(values: dict[str, str]) -> str:
    """The value most configurations share, then the exceptions by name."""
    if not values:
        return "no configuration has been run"
    usual = Counter(values.values()).most_common(1)[0][0]
    others: dict[str, list[str]] = {}
    for config, value in values.items():
        if value != usual:
            others.setdefault(value, []).append(f"`{config}`")
    return usual + "".join(f" ({', '.join(c)}: {v})" for v, c in others.items())


def epoch_count(epochs: int) -> str:
    """``1 epoch``, ``3 epochs``."""
    return f"{epochs} epoch{'s' * (epochs != 1)}"


def training_budget(runs: dict[str, dict]) -> str:
    """``SST 1152, Quora 1152, STS 1152 training examples per task, 1 epoch``: what the
    configurations trained on, the exceptions by name."""
    sizes = usual({n: f"{per_task(m.train_examples)} training examples per task" for n, m in runs.items()})
    epochs = usual({n: epoch_count(m.epochs) for n, m in runs.items()})
    return f"{sizes}, {epochs}"


SMART_NAMES = {
    "epsilon": "epsilon",
    "noise_std": "initial noise",
    "step_size": "ascent step",
    "steps": "ascent steps",
    "lambda_s": "lambda_s",
    "mu": "mu",
    "beta": "teacher momentum",
    "projection": "perturbation bound",
    "token_norm": "per-token norm",
    "dropout_masks": "dropout masks in the perturbed passes",
}


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else f"`{v}`"


def _smart(runs: dict[str, dict], multitask_dir: Path, config: None) -> str:
    values = {
        c: ", ".join(f"{SMART_NAMES.get(k, k)} {_value(v)}" for k, v in asdict(m.settings.smart).items())
        for c, m in runs.items()
        if m.settings.smart
    }
    return usual(values) if values else "no configuration with SMART has been run"


# The reference implementation's per-token bound (docs/smart.md), which the runs' is said against.
REFERENCE_TOKEN_NORM = 1.0


def _token_norm(runs: dict[str, dict], multitask_dir: Path, config: None) -> str:
    values = {
        c: f"{m.settings.smart.token_norm / REFERENCE_TOKEN_NORM:g} times the reference code's size "
        f"(per-token norm {_value(m.settings.smart.token_norm)} against its {REFERENCE_TOKEN_NORM:g})"
        for c, m in runs.items()
        if m.settings.smart and m.settings.smart.projection == "token"
    }
    return usual(values) if values else "no configuration with SMART's per-token bound has been run"


def _optimizers(runs: dict[str, dict], multitask_dir: Path, config: None) -> str:
    by_optimizer: dict[str, dict[str, str]] = {}
    for c, m in runs.items():
        s = m.settings
        by_optimizer.setdefault(s.optimizer, {})[c] = f"{rates(s)}, weight decay {s.weight_decay:g}"
    return "; ".join(usual(values) for values in by_optimizer.values()) or "no configuration has been run"


def _warmup(runs: dict[str, dict], multitask_dir: Path, config: None) -> str:
    settings = usual(
        {
            c: "none"
            if not m.settings.head_warmup.epochs
            else (
                f"up to {m.settings.head_warmup.epochs} passes over the pooled training "
                f"vectors at lr {m.settings.head_warmup.lr:g}"
            )
            for c, m in runs.items()
        }
    )
    kept: dict[str, list[int]] = {}
    capped = 0  # fits whose lowest validation loss was the last pass allowed
    for m in runs.values():
        for task, w in m.head_warmup.items():
            kept.setdefault(task, []).append(w.epochs_kept)
            capped += w.epochs_kept == m.settings.head_warmup.epochs
    if not kept:
        return settings
    ranges = {t: span(k) for t, k in kept.items()}
    said = f"{settings}; passes kept (lowest validation loss), over the runs: {per_task(ranges)}"
    if capped:
        said += (
            f"; in {capped} of the {sum(map(len, kept.values()))} fits the kept pass is the last "
            "allowed, its validation loss still falling: those heads, and the starts they give, may "
            'be short of a converged probe (measured below, "The head warm-up\'s pass cap")'
        )
    return said


def _steps(runs: dict[str, dict], multitask_dir: Path, config: str) -> str:
    if config not in runs:
        return f"`{config}` has not been run"
    m = runs[config]
    return (
        f"`{config}` made {m.steps:,} optimizer steps over "
        f"{sum(m.examples_seen.values()):,} training examples"
    )


def _run_rates(runs: dict[str, dict], multitask_dir: Path, config: str) -> str:
    if config not in runs:
        return f"`{config}` has not been run"
    return f"`{config}` {rates(runs[config].settings)}"


def history_series(multitask_dir: Path, config: str, split: str, key: str) -> pd.Series:
    """A run's history column (``history_column(split, key)``) by epoch, from its
    ``<config>-history.csv``; a missing column is an error naming the file."""
    path = run_log(multitask_dir, config, HISTORY)
    history = pd.read_csv(path).set_index("epoch")
    column = history_column(split, key)
    if column not in history.columns:
        raise ValueError(f"{path}: missing column {column}")
    return history[column]


def _cosine(runs: dict[str, dict], multitask_dir: Path, config: str) -> str:
    if config not in runs or not run_log(multitask_dir, config, HISTORY).is_file():
        return f"`{config}` has not been run"
    best, pearson = runs[config].epoch, history_series(multitask_dir, config, "dev", TASKS["sts"].metric_key)
    return (
        f"`{config}`'s dev-slice STS Pearson (its history) is {pearson[0]:.3f} at epoch 0, the "
        f"checkpoint before any encoder update, and {pearson[best]:.3f} at its chosen epoch {best}"
    )


# Each returns a phrase; those in PER_CONFIG name a configuration: {steps best}.
FACTS = {
    "smart": _smart,
    "token_norm": _token_norm,
    "optimizers": _optimizers,
    "steps": _steps,
    "rates": _run_rates,
    "cosine": _cosine,
    "warmup": _warmup,
}
PER_CONFIG = ("steps", "rates", "cosine")
FACT = re.compile(r"\{(\w+)(?: ([\w-]+))?\}")


def fill_facts(text: str, runs: dict[str, dict], multitask_dir: Path) -> str:
    """``text`` with each ``{fact}`` or ``{fact config}`` replaced by what the runs say."""

    def one(match: re.Match) -> str:
        fact, config = match.groups()
        if fact not in FACTS or (config is None) == (fact in PER_CONFIG):
            raise ValueError(
                f"paper.yaml: {match.group(0)} is not a known fact: use "
                + ", ".join(f"{{{f} <config>}}" if f in PER_CONFIG else f"{{{f}}}" for f in FACTS)
            )
        return FACTS[fact](runs, multitask_dir, config)

    return FACT.sub(one, text)


def with_facts(spec: dict, runs: dict[str, dict], multitask_dir: Path) -> dict:
    """A table's spec from reference/paper.yaml with the facts of its rows' notes filled
    from ``runs`` (``fill_facts``), so that no note says what the runs did not do."""
    rows = [
        {**row, "note": fill_facts(row["note"], runs, multitask_dir)} if row.get("note") else row
        for row in spec["rows"]
    ]
    return {**spec, "rows": rows}


def ablation_parents(paper: dict, tables: list[str]) -> dict[str, str]:
    """Each configuration's ablation parent: that of the first multitask table that
    shows it as a row other than its parent (``best`` is compared with ``baseline``,
    Table 4's rows with ``best``)."""
    parents: dict[str, str] = {}
    for name in tables:
        spec = paper.get(name, {})
        for row in spec.get("rows", []):
            if row["config"] != spec.get("parent"):
                parents.setdefault(row["config"], spec["parent"])
    return parents


def paper_best(paper: dict) -> tuple[str, float] | None:
    """The paper's best model and its dev average (Table 2's last row)."""
    rows = [r for r in paper.get("table2", {}).get("rows", []) if (r.get("paper") or {}).get("average")]
    return (rows[-1]["config"], rows[-1]["paper"]["average"]) if rows else None
