"""The report's tables, each with its intervals, paired differences and notes.

Every "ours" cell is a metrics file's number with a 95% bootstrap interval over the
dev examples; every configuration with an ablation parent gets a paired bootstrap
of its difference from the parent on the same examples. A difference is called
distinguishable only when its interval excludes zero, and the conclusions under
each table say no more than that.
"""

from __future__ import annotations

import statistics

from minbert.metrics import AVERAGE, METRIC, METRIC_TITLE, MULTITASK_TASKS, Interval
from minbert.report.evidence import Evidence, Scored

TASK_NAMES = {"sst": "SST (5 classes)", "cfimdb": "CFIMDB (2 classes)"}
MODE_NAMES = {"last-layer": "last layer only", "full": "full fine-tuning"}
TASK_TITLES = {"sst": "SST", "quora": "Quora", "sts": "STS", "cfimdb": "CFIMDB"}
COLUMNS = [*MULTITASK_TASKS, AVERAGE]
COLUMN_TITLES = {**METRIC_TITLE, AVERAGE: "Average"}
SOURCE_NAMES = {"quora": "the Quora question-pairs release", "sts": "the STS benchmark",
                "sst": "the Stanford Sentiment Treebank", "cfimdb": "IMDB reviews"}
NO_NUMBER = "—"  # a number the source lacks
INTERVAL_NOTE = (
    "Ours: the number on the full dev set, with its 95% interval from a bootstrap over the "
    "dev examples (9,999 resamples, percentile method; the average resamples each task's "
    "examples on its own). Δ: ours minus the parent configuration on the same examples, "
    "with a 95% paired-bootstrap interval; **bold** marks an interval that excludes zero. "
    "Differences whose interval contains zero are not distinguishable on these dev sets, "
    "and the table does not rank them.")


def fmt(x: float | None) -> str:
    return NO_NUMBER if x is None else f"{x:.3f}"


def fmt_interval(iv: Interval) -> str:
    return f"{iv.value:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def fmt_difference(iv: Interval) -> str:
    text = f"{iv.value:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"
    return f"**{text}**" if iv.excludes_zero else text


def _row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def _header(cells: list[str]) -> list[str]:
    return [_row(cells), "|" + "---|" * len(cells)]


def multitask_scored(evidence: Evidence, folder: str, name: str, metrics: dict) -> Scored:
    """A multitask-style run's evidence: ``<folder>/<name>/<task>-dev-out.csv``."""
    prefix = f"{folder}/{name}/" if name else f"{folder}/"
    return evidence.scored(f"{folder}/{name}".rstrip("/"),
                           {t: f"{prefix}{t}-dev-out.csv" for t in MULTITASK_TASKS},
                           {t: metrics[METRIC[t]] for t in MULTITASK_TASKS})


# ----------------------------------------------------------------------------- notes


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
            for o in data["course_overlap"])
        notes.append(
            f"> **Checkpoint:** `{ck['name']}` was trained further, after its pretraining, on "
            f"{data['examples']:,} examples from {data['datasets']} datasets for sentence "
            f"similarity (its `{data['file']}`)" + (f", among them {overlap}" if overlap else "")
            + ". Its paraphrase and similarity scores are those of an encoder already tuned to "
            "compare sentences, not of BERT's pretraining alone: the zero-shot row of Table 2 "
            "shows what it scores before any fine-tuning.")
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
    lines = [f"> **Warning:** the Quora numbers of {', '.join(f'`{c}`' for c in configs)} are NOT "
             f"on the official Quora split. {note}" for note, configs in carved.items()]
    if official:
        lines.append(f"Quora split of {', '.join(f'`{c}`' for c in official)}: the official "
                     "course train / dev split.")
    return lines


def _per_task(counts: dict) -> str:
    return ", ".join(f"{TASK_TITLES.get(t, t)} {n}" for t, n in counts.items())


def provenance(m: dict, name: str | None = None) -> str:
    """One line saying how a multitask configuration's numbers were produced."""
    ck, s = m["checkpoint"], m["settings"]
    schedule = (f"× {s['lr_gamma']} per epoch" if s["lr_schedule"] == "exponential" else "constant")
    sliced = m["history_examples"]["dev"]
    line = (
        f"- `{name or m['config']}`: epoch {m['best_epoch']} of {m['epochs']} (best dev-slice "
        f"average); training examples {_per_task(m['train_examples'])}; dev examples "
        f"{_per_task(m['dev_examples'])} (dev slice scored each epoch: {_per_task(sliced)}); "
        f"paraphrase head `{s['paraphrase_head']}`, STS head `{s['sts_head']}` "
        f"(output `{s['sts_output']}`), gradient `{s['gradient']}`, {s['optimizer']} lr {s['lr']} "
        f"{schedule}, weight decay {s['weight_decay']}, batch {_per_task(m['batch_size'])}, "
        f"dropout {s['dropout']}, SMART {'on' if s.get('smart') else 'off'}, pooling "
        f"`{s['pooling']}`; checkpoint `{ck['name']}` ({ck['weights']} sha256 {ck['sha256'][:12]}…); "
        f"seed {m['seed']}; scale `{m['scale']}`; device {m['device']}.")
    if "pcgrad_conflict_fraction" in m:
        line = line[:-1] + f"; PCGrad conflict fraction {m['pcgrad_conflict_fraction']:.3f}."
    return line


# ----------------------------------------------------------------------------- Table 1


def table1(metrics: list[dict], spec: dict, evidence: Evidence) -> str:
    by_cell = {(m["task"], m["mode"]): m for m in metrics}
    scored = {key: evidence.scored(f"sentiment/{m['run']}", {m["task"]: f"sentiment/{m['run']}/dev-out.csv"},
                                   {m["task"]: m["dev_accuracy"]}) for key, m in by_cell.items()}
    refs = spec["references"]
    header = ["Task"]
    for mode_name in MODE_NAMES.values():
        header += [f"{mode_name} (ours)"] + [f"{mode_name} ({r['name']})" for r in refs]
    header.append("Δ full − last layer (ours, paired)")
    lines = _header(header)
    for task, name in TASK_NAMES.items():
        row = [name]
        for mode in MODE_NAMES:
            ours = scored.get((task, mode))
            row.append(fmt_interval(evidence.cell(ours, task)) if ours else "not run")
            row += [fmt(r["rows"].get(task, {}).get(mode)) for r in refs]
        full, last = scored.get((task, "full")), scored.get((task, "last-layer"))
        row.append(fmt_difference(evidence.difference(full, last, task)) if full and last else NO_NUMBER)
        lines.append(_row(row))
    notes = ["", INTERVAL_NOTE.replace("the parent configuration", "last layer only"), "",
             "How each of our numbers was produced:", ""]
    if not by_cell:
        notes.append("- no sentiment metrics: the `sentiment` stage has not been run.")
    for m in sorted(by_cell.values(), key=lambda m: (m["task"], m["mode"])):
        ck = m["checkpoint"]
        notes.append(
            f"- `{m['run']}`: epoch {m['best_epoch']} of {m['epochs']} (best dev accuracy); "
            f"{m['train_examples']} training examples ({m['data_split']}), {m['dev_examples']} dev "
            f"examples; lr {m['lr']}, batch {m['batch_size']}, {m['optimizer']}, pooling "
            f"`{m['pooling']}`; checkpoint `{ck['name']}` ({ck['weights']} sha256 {ck['sha256'][:12]}…); "
            f"seed {m['seed']}; scale `{m['scale']}`; device {m['device']}.")
    notes += [""] + [f"Reference column \"{r['name']}\": {r['source'].strip()}" for r in refs]
    return "\n".join(lines + notes)


# ----------------------------------------------------------------------------- Tables 2-4


def _paper_cells(paper: dict | None) -> list[str]:
    return [fmt(None if paper is None else paper.get(c)) for c in COLUMNS]


def multitask_table(spec: dict, runs: dict[str, dict], evidence: Evidence,
                    zero_shot: dict | None = None) -> str:
    """One of Tables 2-4: ours (with intervals) beside the paper's, the paired
    difference of each row from the table's parent, and where the numbers came from."""
    parent_name = spec["parent"]
    parent = (multitask_scored(evidence, "multitask", parent_name, runs[parent_name])
              if parent_name in runs else None)
    header = ["Configuration"]
    for c in COLUMNS:
        header += [f"{COLUMN_TITLES[c]} (ours)", f"{COLUMN_TITLES[c]} (paper)"]
    header.append(f"Δ average vs `{parent_name}`")
    lines, footnotes, differences = _header(header), [], []

    def label_of(text: str, note: str | None = None) -> str:
        text = text.replace("|", "\\|")  # a "|" (as in |u − v|) would end the cell
        if note:
            footnotes.append(note.strip())
            text += f" [{len(footnotes)}]"
        return text

    if spec.get("zero_shot") and zero_shot is not None:
        scored = multitask_scored(evidence, "zero-shot", "", zero_shot)
        cells = [label_of("Untrained checkpoint, zero-shot (`zero-shot`)",
                          "No fine-tuning: " + "; ".join(f"{TASK_TITLES[t]}: {how}" for t, how
                                                         in zero_shot["method"].items()) + ".")]
        for c in COLUMNS:
            iv = evidence.average(scored) if c == AVERAGE else evidence.cell(scored, c)
            cells += [fmt_interval(iv), NO_NUMBER]
        delta = (fmt_difference(evidence.average_difference(scored, parent)) if parent else NO_NUMBER)
        lines.append(_row(cells + [delta]))
        if parent:
            differences.append(("zero-shot", scored))
    for row in spec["rows"]:
        config, m = row["config"], runs.get(row["config"])
        cells = [label_of(f"{row['label']} (`{config}`)", row.get("note"))]
        if m is None:
            cells += [c for p in _paper_cells(row.get("paper")) for c in ("not run", p)]
            lines.append(_row(cells + [NO_NUMBER]))
            continue
        scored = multitask_scored(evidence, "multitask", config, m)
        for c, paper in zip(COLUMNS, _paper_cells(row.get("paper"))):
            iv = evidence.average(scored) if c == AVERAGE else evidence.cell(scored, c)
            cells += [fmt_interval(iv), paper]
        if config == parent_name:
            delta = "(parent)"
        elif parent:
            delta = fmt_difference(evidence.average_difference(scored, parent))
            differences.append((config, scored))
        else:
            delta = "parent not run"
        lines.append(_row(cells + [delta]))
    if spec.get("test"):
        test = spec["test"]
        cells = [label_of(f"{test['label']} (`{test['config']}`)",
                          "The course's test labels are not public: this pipeline writes test "
                          "predictions (`predictions/`) but cannot score them.")]
        cells += [c for p in _paper_cells(test["paper"]) for c in ("not scored", p)]
        lines.append(_row(cells + [NO_NUMBER]))

    notes = ["", INTERVAL_NOTE.replace("the parent configuration", f"`{parent_name}`")]
    if differences:
        notes += ["", f"Paired differences from `{parent_name}` (ours minus `{parent_name}`, same "
                  "dev examples, 95% interval; **bold**: distinguishable from zero):", ""]
        notes += _header(["Configuration", *(f"Δ {COLUMN_TITLES[c]}" for c in COLUMNS)])
        said = []
        for name, scored in differences:
            ivs = {c: (evidence.average_difference(scored, parent) if c == AVERAGE
                       else evidence.difference(scored, parent, c)) for c in COLUMNS}
            notes.append(_row([f"`{name}`", *(fmt_difference(ivs[c]) for c in COLUMNS)]))
            said.append(_conclusion(name, parent_name, ivs))
        notes += ["", "What these dev sets can and cannot tell apart:", ""] + said
    present = [runs[c] for c in dict.fromkeys(r["config"] for r in spec["rows"]) if c in runs]
    notes.append("")
    if present:
        notes += quora_notes(present) + [""] + checkpoint_notes(present)
        notes += ["", "How each of our numbers was produced:", ""] + [provenance(m) for m in present]
    else:
        notes.append("None of this table's configurations has been run (stage `multitask`).")
    notes += ["", f"Paper column: {spec['source'].strip()}"]
    if footnotes:
        notes += [""] + [f"- [{i}] {n}" for i, n in enumerate(footnotes, start=1)]
    return "\n".join(lines + notes)


def _conclusion(name: str, parent: str, ivs: dict[str, Interval]) -> str:
    apart = [f"{COLUMN_TITLES[c]} {'higher' if ivs[c].value > 0 else 'lower'} by "
             f"{abs(ivs[c].value):.3f}" for c in COLUMNS if ivs[c].excludes_zero]
    if not apart:
        return f"- `{name}` vs `{parent}`: no difference is distinguishable from zero."
    same = [COLUMN_TITLES[c] for c in COLUMNS if not ivs[c].excludes_zero]
    tail = f"; {', '.join(same)}: not distinguishable" if same else ""
    return f"- `{name}` vs `{parent}`: {'; '.join(apart)}{tail}."


# ----------------------------------------------------------------------------- MLM


def mlm_section(pretraining: dict[str, dict], tuned: list[dict], runs: dict[str, dict],
                evidence: Evidence) -> str:
    """Pretraining metrics, then each configuration fine-tuned from an MLM checkpoint
    beside the same configuration fine-tuned from the original checkpoint."""
    if not pretraining:
        return ("MLM pretraining was not run with these parameters (`mlm.pretrain` is empty). "
                "Switch it on with `dvc exp run -S 'mlm.pretrain=[continue]'` (or `[scratch]`, "
                "or both); the configurations in `mlm.finetune` are then fine-tuned a second "
                "time from the pretrained checkpoint and shown here beside the first.")
    lines = _header(["MLM start", "masked-token accuracy before", "after", "perplexity before",
                     "after", "training sequences", "held-out sequences"])
    for start, m in pretraining.items():
        b, a, c = m["before"], m["after"], m["corpus"]
        lines.append(_row([f"`{start}`", f"{b['masked_accuracy']:.3f}", f"{a['masked_accuracy']:.3f}",
                           f"{b['perplexity']:.1f}", f"{a['perplexity']:.1f}",
                           str(c["train_sequences"]), str(c["heldout_sequences"])]))
    lines += ["", "Masked-token accuracy and perplexity are measured on held-out sequences of the "
              "training text (masks drawn once, the same positions before and after); "
              "no dev or test text is in the pretraining corpus.", ""]
    lines += _header(["Configuration", "Fine-tuned from",
                      *(f"{COLUMN_TITLES[c]} (ours)" for c in COLUMNS), "Δ average vs without MLM"])
    notes = []
    for m in sorted(tuned, key=lambda m: (m["config"], m["pretraining"]["start"])):
        name = f"{m['pretraining']['start']}-{m['config']}"
        scored = multitask_scored(evidence, "multitask-mlm", name, m)
        base = runs.get(m["config"])
        base_scored = multitask_scored(evidence, "multitask", m["config"], base) if base else None
        for run, s, origin in ((base, base_scored, "original"), (m, scored, "MLM")):
            if run is None:
                continue
            cells = [f"`{m['config']}`", f"`{run['checkpoint']['name']}`"]
            cells += [fmt_interval(evidence.average(s) if c == AVERAGE else evidence.cell(s, c))
                      for c in COLUMNS]
            delta = ("(parent)" if origin == "original" else
                     fmt_difference(evidence.average_difference(s, base_scored)) if base_scored
                     else NO_NUMBER)
            lines.append(_row(cells + [delta]))
        if base_scored:
            ivs = {c: (evidence.average_difference(scored, base_scored) if c == AVERAGE
                       else evidence.difference(scored, base_scored, c)) for c in COLUMNS}
            notes.append(_conclusion(f"{name}", m["config"], ivs))
        notes.append(provenance(m, name))
    return "\n".join(lines + ["", INTERVAL_NOTE.replace("the parent configuration",
                                                          "the same configuration without MLM"),
                              "", *notes])


# ----------------------------------------------------------------------------- seeds


def seed_section(study: dict | None) -> str:
    """The seed study (``minbert seed-study``): mean ± sample standard deviation per cell."""
    if study is None:
        return ("No seed study has been committed (`metrics/seed-study.json`). Run it with "
                "`minbert seed-study` (see the README).")
    lines = [f"Each configuration trained with seeds {', '.join(map(str, study['seeds']))}, the "
             "seed changing the heads' initialisation, the dropout masks, the training subsets "
             "and the batch order; every cell is the mean ± sample standard deviation over the "
             f"seeds on the full dev sets. Regenerate it with `{study['command']}` "
             f"({study['how']}).", ""]
    lines += _header(["Configuration", *(COLUMN_TITLES[c] for c in COLUMNS), "seeds"])
    for config, runs in study["configs"].items():
        cells = [f"`{config}`"]
        for c in COLUMNS:
            values = [r[METRIC[c] if c != AVERAGE else AVERAGE] for r in runs]
            cells.append(f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"
                         if len(values) > 1 else f"{values[0]:.3f}")
        cells.append(", ".join(str(r["seed"]) for r in runs))
        lines.append(_row(cells))
    lines += ["", "A seed-to-seed standard deviation comparable to a difference between two "
              "configurations means that difference could be the seed's doing, whatever its "
              "bootstrap interval over examples says."]
    return "\n".join(lines)
