"""The notes under a table: which Quora split, what the checkpoint was trained on, and
how each number was produced."""

from __future__ import annotations

from minbert.report.cells import SOURCE_NAMES, TASK_TITLES


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


def per_task(counts: dict) -> str:
    return ", ".join(f"{TASK_TITLES.get(t, t)} {n}" for t, n in counts.items())


def provenance(m: dict, name: str | None = None) -> str:
    """One line saying how a multitask configuration's numbers were produced."""
    ck, s = m["checkpoint"], m["settings"]
    schedule = f"× {s['lr_gamma']} per epoch" if s["lr_schedule"] == "exponential" else "constant"
    sliced = m["history_examples"]["dev"]
    line = (
        f"- `{name or m['config']}`: epoch {m['best_epoch']} of {m['epochs']} (best dev-slice "
        f"average); training examples {per_task(m['train_examples'])}; dev examples "
        f"{per_task(m['dev_examples'])} (dev slice scored each epoch: {per_task(sliced)}); "
        f"paraphrase head `{s['paraphrase_head']}`, STS head `{s['sts_head']}` "
        f"(output `{s['sts_output']}`), gradient `{s['gradient']}`, {s['optimizer']} lr {s['lr']} "
        f"{schedule}, weight decay {s['weight_decay']}, batch {per_task(m['batch_size'])}, "
        f"dropout {s['dropout']}, SMART {'on' if s.get('smart') else 'off'}, pooling "
        f"`{s['pooling']}`; checkpoint `{ck['name']}` ({ck['weights']} sha256 {ck['sha256'][:12]}…); "
        f"seed {m['seed']}; scale `{m['scale']}`; device {m['device']}."
    )
    if "pcgrad_conflict_fraction" in m:
        line = line[:-1] + f"; PCGrad conflict fraction {m['pcgrad_conflict_fraction']:.3f}."
    return line
