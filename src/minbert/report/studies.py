"""The report's sections beyond the paper's tables: what chose each run's epoch and
learning rates, MLM pretraining before fine-tuning, and the seed study."""

from __future__ import annotations

import statistics

from minbert.report.cells import (
    COLUMN_TITLES,
    COLUMNS,
    NO_NUMBER,
    Comparison,
    budget_gap,
    conclusion,
    fmt_budget,
    fmt_difference,
    fmt_interval,
    md_header,
    md_row,
    multitask_scored,
    per_task,
)
from minbert.report.evidence import Evidence
from minbert.report.notes import rates, selection_note, usual
from minbert.results import ACCURACY
from minbert.tasks import AVERAGE


def selection_section(
    runs: dict[str, dict], params: dict | None, lr_search: dict | None, sources: dict[str, str]
) -> str:
    """What chose each run's epoch and its learning rates, per scale: the runs' own
    metrics for the scale they ran at, ``params`` (params.yaml) for the others, and
    ``sources`` (paper.yaml's ``learning_rates``: scale -> what chose its rates)."""
    if not runs:
        return "No multitask configuration has been run (stage `multitask`)."
    ran = list(dict.fromkeys(m["scale"] for m in runs.values()))
    scales = list(dict.fromkeys([*(params["scales"] if params else []), *ran]))
    lines = [
        selection_note(list(runs.values())),
        "",
        *md_header(["Scale", "Validation split, examples per task", "Learning rates", "Chosen by"]),
    ]
    for scale in scales:
        if scale in ran:
            mine = {c: m for c, m in runs.items() if m["scale"] == scale}
            validation = usual({c: per_task(m["validation_examples"]) for c, m in mine.items()})
            by_optimizer: dict[str, dict[str, str]] = {}
            for c, m in mine.items():
                by_optimizer.setdefault(m["settings"]["optimizer"], {})[c] = rates(m["settings"])
            learning_rates = "; ".join(usual(v) for v in by_optimizer.values())
            label = f"`{scale}` (the runs above)"
        else:
            sized = params["scales"][scale]["multitask"]
            validation = (
                per_task(sized["validation_examples"]) if "validation_examples" in sized else NO_NUMBER
            )
            learning_rates = "; ".join(
                rates({"optimizer": name, **spec}) for name, spec in sized["optimizers"].items()
            )
            label = f"`{scale}` (params.yaml)"
        chosen_by = sources.get(scale, "not stated (reference/paper.yaml `learning_rates`)")
        lines.append(md_row([label, validation, learning_rates, chosen_by.strip()]))
    dev_slice = usual({c: per_task(m["history_examples"]["dev"]) for c, m in runs.items()})
    lines += [
        "",
        "Dev is scored once per configuration, with the chosen epoch, for the tables, and "
        "chooses nothing; the dev "
        f"slice scored after every epoch (the history's `dev_*` columns: {dev_slice}) is drawn "
        "in the figures only.",
        "",
        *lr_search_section(lr_search, runs),
    ]
    return "\n".join(lines)


LR_SEARCH_KEYS = ("optimizer", "lr", "head_lr", "validation_average")


def lr_search_section(study: dict | None, runs: dict[str, dict]) -> list[str]:
    """The learning-rate search (``metrics/lr-search.json``): every point, the chosen
    one per optimizer in bold, and any run above that did not use the choice."""
    if study is None:
        return [
            "No learning-rate search has been committed (`metrics/lr-search.json`); run "
            "`minbert lr-search` (see the README)."
        ]
    for i, point in enumerate(study["runs"]):
        missing = [k for k in LR_SEARCH_KEYS if k not in point]
        if missing:
            raise ValueError(f"metrics/lr-search.json: runs[{i}] lacks {', '.join(missing)}")
    chosen = list(study.get("chosen", {}).values())

    def is_chosen(point: dict) -> bool:
        return any(
            all(point.get(k) == c[k] for k in ("scale", "optimizer", "lr", "head_lr") if k in c)
            for c in chosen
        )

    lines = [
        f"Learning-rate search (`metrics/lr-search.json`, `{study.get('command', 'minbert lr-search')}`): "
        "each point trains the configuration at its scale without scoring dev, and scores the "
        "validation average of its best epoch; the best point per scale and optimizer is "
        "chosen (**bold**).",
        "",
        *md_header(
            [
                "Scale",
                "Configuration",
                "Optimizer",
                "lr",
                "head lr",
                "best epoch",
                "validation average",
                "optimizer steps",
            ]
        ),
    ]
    order = sorted(study["runs"], key=lambda r: (r.get("scale", ""), r["optimizer"], r["lr"], r["head_lr"]))
    for point in order:
        average = f"{point['validation_average']:.3f}"
        lines.append(
            md_row(
                [
                    f"`{point.get('scale', NO_NUMBER)}`",
                    f"`{point.get('config', NO_NUMBER)}`",
                    point["optimizer"],
                    f"{point['lr']:g}",
                    f"{point['head_lr']:g}",
                    str(point.get("best_epoch", NO_NUMBER)),
                    f"**{average}**" if is_chosen(point) else average,
                    f"{point['optimizer_steps']:,}" if "optimizer_steps" in point else NO_NUMBER,
                ]
            )
        )
    for c in chosen:
        # Runs at the search's scale with its optimizer that used other rates, by rates.
        other: dict[str, list[str]] = {}
        for name, m in runs.items():
            s = m["settings"]
            if s["optimizer"] != c["optimizer"] or c.get("scale", m["scale"]) != m["scale"]:
                continue
            if (s["lr"], s.get("head_lr")) != (c["lr"], c["head_lr"]):
                other.setdefault(rates(s), []).append(f"`{name}`")
        for used, names in other.items():
            lines += [
                "",
                f"Note: {', '.join(names)} ran {used}, not the search's choice for {c['optimizer']} "
                f"(lr {c['lr']:g}, heads {c['head_lr']:g}).",
            ]
    return lines


def mlm_section(
    pretraining: dict[str, dict], tuned: list[dict], runs: dict[str, dict], evidence: Evidence
) -> str:
    """Pretraining metrics, then each configuration fine-tuned from an MLM checkpoint
    beside the same configuration fine-tuned from the original checkpoint."""
    if not pretraining:
        return (
            "MLM pretraining was not run with these parameters (`mlm.pretrain` is empty). "
            "Switch it on with `dvc exp run -S 'mlm.pretrain=[continue]'` (or `[scratch]`, "
            "or both); the configurations in `mlm.finetune` are then fine-tuned a second "
            "time from the pretrained checkpoint and shown here beside the first."
        )
    lines = md_header(
        [
            "MLM start",
            "masked-token accuracy before",
            "after",
            "perplexity before",
            "after",
            "training sequences",
            "held-out sequences",
            "MLM head",
        ]
    )
    for start, m in pretraining.items():
        b, c = m["before"], m["corpus"]
        lines.append(
            md_row(
                [
                    f"`{start}`",
                    f"{b['masked_accuracy']:.3f}",
                    f"{m[ACCURACY]:.3f}",
                    f"{b['perplexity']:.1f}",
                    f"{m['after']['perplexity']:.1f}",
                    str(c["train_sequences"]),
                    str(c["heldout_sequences"]),
                    m["head"],
                ]
            )
        )
    lines += [
        "",
        "Masked-token accuracy and perplexity are measured on held-out sequences of the "
        "training text (masks drawn once, the same positions before and after); "
        "no dev or test text is in the pretraining corpus. A checkpoint without an MLM "
        "head (a sentence-embedding model drops it) starts from a fresh one: its "
        "'before' is a random head's, and the pretraining mostly trains that head.",
        "",
    ]
    lines += md_header(
        [
            "Configuration",
            "Fine-tuned from",
            *(f"{COLUMN_TITLES[c]} (ours)" for c in COLUMNS),
            "Steps / examples",
            "Δ average vs without MLM",
        ]
    )
    notes = []
    for m in sorted(tuned, key=lambda m: (m["config"], m["pretraining"]["start"])):
        name = f"{m['pretraining']['start']}-{m['config']}"
        scored = multitask_scored(evidence, "multitask-mlm", name, m)
        base = runs.get(m["config"])
        base_scored = multitask_scored(evidence, "multitask", m["config"], base) if base else None
        # Not in the seed study: the sign across seeds is not checked.
        comparison = Comparison(budget=budget_gap(m, base)) if base else None
        for run, s, origin in ((base, base_scored, "original"), (m, scored, "MLM")):
            if run is None:
                continue
            cells = [f"`{m['config']}`", f"`{run['checkpoint']['name']}`"]
            cells += [fmt_interval(evidence.column(s, c)) for c in COLUMNS]
            cells.append(fmt_budget(run))
            delta = (
                "(parent)"
                if origin == "original"
                else fmt_difference(evidence.average_difference(s, base_scored), comparison)
                if base_scored
                else NO_NUMBER
            )
            lines.append(md_row(cells + [delta]))
        if base_scored:
            ivs = {c: evidence.column_difference(scored, base_scored, c) for c in COLUMNS}
            notes.append(conclusion(f"{name}", m["config"], ivs, comparison))
    lead = ["", "Δ: ours minus the same configuration fine-tuned from the original checkpoint."]
    return "\n".join(lines + lead + (["", *notes] if notes else []))


def seed_section(study: dict | None, parents: dict[str, str]) -> str:
    """The seed study (``minbert seed-study``): mean ± sample standard deviation per
    cell, and each configuration's average minus its ablation parent's (``parents``,
    from the report's tables) seed by seed."""
    if study is None:
        return (
            "No seed study has been committed (`metrics/seed-study.json`). Run it with "
            "`minbert seed-study` (see the README)."
        )
    configs = study["configs"]
    lines = [
        f"Each configuration trained with seeds {', '.join(map(str, study['seeds']))}, the "
        "seed changing the heads' initialisation, the dropout masks, the training subsets "
        "and the batch order; every cell is the mean ± sample standard deviation over the "
        f"seeds on the full dev sets. Regenerate it with `{study['command']}` "
        f"({study['how']}).",
        "",
    ]
    lines += md_header(
        ["Configuration", *(COLUMN_TITLES[c] for c in COLUMNS), "seeds", "Average − parent, per seed"]
    )
    verdicts = []
    for config, runs in configs.items():
        cells = [f"`{config}`"]
        for c in COLUMNS:
            values = [r[c] for r in runs]
            cells.append(
                f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"
                if len(values) > 1
                else f"{values[0]:.3f}"
            )
        cells.append(", ".join(str(r["seed"]) for r in runs))
        parent = parents.get(config)
        diffs = _per_seed_differences(runs, configs.get(parent, []))
        if diffs:
            cells.append(f"vs `{parent}`: " + ", ".join(f"{d:+.3f}" for d in diffs.values()))
            verdicts.append(_seed_verdict(config, parent, diffs))
        else:
            cells.append(NO_NUMBER)
        lines.append(md_row(cells))
    lines += [
        "",
        "Average − parent: the configuration's average minus that of the configuration it "
        "ablates (as in the tables above), trained with the same seed, one number per seed "
        "in the order of the seeds column. A seed-to-seed standard deviation comparable to a "
        "difference between two configurations means that difference could be the seed's "
        "doing, whatever its bootstrap interval over examples says. With this few seeds, a "
        "sign shared by every seed is a consistency check, not a test: the tables above call "
        "a difference distinguishable only when its sign, column by column, holds with every "
        "seed here.",
    ]
    if verdicts:
        lines += ["", *verdicts]
    return "\n".join(lines)


def _per_seed_differences(runs: list[dict], parent_runs: list[dict]) -> dict[int, float]:
    """Average minus the parent's average, for each seed both were trained with."""
    parent = {r["seed"]: r[AVERAGE] for r in parent_runs}
    return {r["seed"]: r[AVERAGE] - parent[r["seed"]] for r in runs if r["seed"] in parent}


def _seed_verdict(config: str, parent: str, diffs: dict[int, float]) -> str:
    seeds = len(diffs)
    if all(d > 0 for d in diffs.values()):
        return f"- `{config}` vs `{parent}`: higher average with all {seeds} seeds."
    if all(d < 0 for d in diffs.values()):
        return f"- `{config}` vs `{parent}`: lower average with all {seeds} seeds."
    return f"- `{config}` vs `{parent}`: the sign of the difference changes with the seed; not separated."
