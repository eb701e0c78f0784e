"""The notes under a table: which Quora split, what the checkpoint was trained on, how
each number was produced; and the facts the report's prose quotes from the runs.

Prose in ``reference/paper.yaml`` (the choices where the paper is silent) names facts
such as ``{smart}`` or ``{steps best-round-robin}`` rather than writing numbers that a
new run would leave stale: ``fill_facts`` replaces each with what the metrics say.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pandas as pd

from minbert.report.cells import SOURCE_NAMES, TASK_TITLES, per_task


def checkpoint_notes(runs: list[dict]) -> list[str]:
    """One note per checkpoint whose further training the runs' metrics record (from
    its training-data file); none for a checkpoint that was only pretrained."""
    notes, seen = [], set()
    for m in runs:
        ck = m["checkpoint"]
        data = ck.get("training_data")
        if not data or ck["name"] in seen:
            continue
        seen.add(ck["name"])
        overlap = "; ".join(
            f"`{o['dataset']}` ({o['examples']:,} examples) from {SOURCE_NAMES[o['task']]}, "
            f"which the course's {TASK_TITLES[o['task']]} data also comes from"
            for o in data["course_overlap"]
        )
        notes.append(
            f"> **Checkpoint:** `{ck['name']}` was trained further, after its pretraining, on "
            f"{data['examples']:,} examples from {data['datasets']} datasets for sentence "
            f"similarity (its `{data['file']}`)"
            + (f", among them {overlap}" if overlap else "")
            + ". Its paraphrase and similarity scores are those of an encoder already tuned to "
            "compare sentences, not of BERT's pretraining alone: the zero-shot row of Table 2 "
            "shows what it scores before any fine-tuning."
        )
    return notes


def quora_notes(runs: list[dict]) -> list[str]:
    """The Quora split under a table: a warning for a carved split, else a plain note."""
    carved: dict[str, list[str]] = {}
    official = []
    for m in runs:
        split = m["data_split"]["quora"]
        if split.get("kind") == "official":
            official.append(m["config"])
        else:
            carved.setdefault(split.get("note", split.get("kind")), []).append(m["config"])
    lines = [
        f"> **Warning:** the Quora numbers of {', '.join(f'`{c}`' for c in configs)} are NOT "
        f"on the official Quora split. {note}"
        for note, configs in carved.items()
    ]
    if official:
        lines.append(
            f"Quora split of {', '.join(f'`{c}`' for c in official)}: the official course train / dev split."
        )
    return lines


def selection_note(runs: list[dict]) -> str:
    """What chose each run's epoch, in its metrics file's words (once when all agree)."""
    chosen: dict[str, list[str]] = {}
    for m in runs:
        chosen.setdefault(m["selection"], []).append(f"`{m['config']}`")
    if len(chosen) == 1:
        return f"The epoch of each run: {next(iter(chosen))}."
    return "The epoch of each run: " + "; ".join(f"{', '.join(c)}: {s}" for s, c in chosen.items()) + "."


def rates(s: dict) -> str:
    """A multitask run's optimizer, learning rates and schedule, from its settings."""
    schedule = f"× {s['lr_gamma']} per epoch" if s["lr_schedule"] == "exponential" else "constant"
    heads = f" (heads {s['head_lr']:g})" if s.get("head_lr") is not None else ""
    return f"{s['optimizer']} lr {s['lr']:g}{heads}, {schedule}"


def provenance(m: dict, name: str | None = None) -> str:
    """One line saying how a multitask configuration's numbers were produced."""
    ck, s = m["checkpoint"], m["settings"]
    sliced = m["history_examples"]["dev"]
    line = (
        f"- `{name or m['config']}`: epoch {m['best_epoch']} of {m['epochs']}, "
        f"{m['optimizer_steps']:,} optimizer steps; training examples {per_task(m['train_examples'])} "
        f"(seen over all epochs: {per_task(m['examples_seen'])}); validation examples "
        f"{per_task(m['validation_examples'])}; dev examples {per_task(m['dev_examples'])} "
        f"(dev slice scored after each epoch, for the figures only: {per_task(sliced)}); "
        f"paraphrase head `{s['paraphrase_head']}`, STS head `{s['sts_head']}` "
        f"(output `{s['sts_output']}`), gradient `{s['gradient']}`, {rates(s)}, "
        f"weight decay {s['weight_decay']}, batch {per_task(m['batch_size'])}, "
        f"dropout {s['dropout']}, SMART {'on' if s.get('smart') else 'off'}, pooling "
        f"`{s['pooling']}`; checkpoint `{ck['name']}` ({ck['weights']} sha256 {ck['sha256'][:12]}…); "
        f"seed {m['seed']}; scale `{m['scale']}`; device {m['device']}."
    )
    if "pcgrad_conflict_fraction" in m:
        line = line[:-1] + f"; PCGrad conflict fraction {m['pcgrad_conflict_fraction']:.3f}."
    return line


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
        c: ", ".join(f"{SMART_NAMES.get(k, k)} {_value(v)}" for k, v in m["settings"]["smart"].items())
        for c, m in runs.items()
        if m["settings"].get("smart")
    }
    return usual(values) if values else "no configuration with SMART has been run"


def _optimizers(runs: dict[str, dict], multitask_dir: Path, config: None) -> str:
    by_optimizer: dict[str, dict[str, str]] = {}
    for c, m in runs.items():
        s = m["settings"]
        by_optimizer.setdefault(s["optimizer"], {})[c] = f"{rates(s)}, weight decay {s['weight_decay']:g}"
    return "; ".join(usual(values) for values in by_optimizer.values()) or "no configuration has been run"


def _sizes(runs: dict[str, dict], multitask_dir: Path, config: None) -> str:
    def each(key) -> str:
        return usual({c: key(m) for c, m in runs.items()})

    scale = each(lambda m: f"`{m['scale']}`")
    checkpoint = each(lambda m: f"`{m['checkpoint']['name']}`")
    pooling = each(lambda m: f"`{m['settings']['pooling']}`")
    return (
        f"scale {scale}; checkpoint {checkpoint} read by {pooling} pooling; training examples "
        f"{each(lambda m: per_task(m['train_examples']))}; {each(lambda m: str(m['epochs']))} epochs; "
        f"batches of {each(lambda m: per_task(m['batch_size']))}"
    )


def _warmup(runs: dict[str, dict], multitask_dir: Path, config: None) -> str:
    settings = usual(
        {
            c: "none"
            if not (m["settings"].get("head_warmup") or {}).get("epochs")
            else (
                f"up to {m['settings']['head_warmup']['epochs']} passes over the pooled training "
                f"vectors at lr {m['settings']['head_warmup']['lr']:g}"
            )
            for c, m in runs.items()
        }
    )
    kept: dict[str, list[int]] = {}
    for m in runs.values():
        for task, w in (m.get("head_warmup") or {}).items():
            kept.setdefault(task, []).append(w["epochs_kept"])
    if not kept:
        return settings
    ranges = {t: f"{min(k)}" if min(k) == max(k) else f"{min(k)}-{max(k)}" for t, k in kept.items()}
    return f"{settings}; passes kept (lowest validation loss), over the runs: {per_task(ranges)}"


def _steps(runs: dict[str, dict], multitask_dir: Path, config: str) -> str:
    if config not in runs:
        return f"`{config}` has not been run"
    m = runs[config]
    return (
        f"`{config}` made {m['optimizer_steps']:,} optimizer steps over "
        f"{sum(m['examples_seen'].values()):,} training examples"
    )


def _cosine(runs: dict[str, dict], multitask_dir: Path, config: str) -> str:
    path = Path(multitask_dir) / f"{config}-history.csv"
    if config not in runs or not path.is_file():
        return f"`{config}` has not been run"
    history = pd.read_csv(path).set_index("epoch")
    if "dev_sts_pearson" not in history.columns:
        raise ValueError(f"{path}: missing column dev_sts_pearson")
    best, pearson = runs[config]["best_epoch"], history.dev_sts_pearson
    return (
        f"`{config}`'s dev-slice STS Pearson (its history) is {pearson[0]:.3f} at epoch 0, the "
        f"checkpoint before any encoder update, and {pearson[best]:.3f} at its chosen epoch {best}"
    )


# Each returns a phrase; those in PER_CONFIG name a configuration: {steps best}.
FACTS = {
    "smart": _smart,
    "optimizers": _optimizers,
    "sizes": _sizes,
    "steps": _steps,
    "cosine": _cosine,
    "warmup": _warmup,
}
PER_CONFIG = ("steps", "cosine")
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
