"""The report's sections beyond the paper's tables: MLM pretraining before fine-tuning,
and the seed study."""

from __future__ import annotations

import statistics

from minbert.metrics import AVERAGE, METRIC
from minbert.report.cells import (
    COLUMN_TITLES,
    COLUMNS,
    INTERVAL_NOTE,
    NO_NUMBER,
    conclusion,
    fmt_difference,
    fmt_interval,
    md_header,
    md_row,
    multitask_scored,
)
from minbert.report.evidence import Evidence
from minbert.report.notes import provenance


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
        b, a, c = m["before"], m["after"], m["corpus"]
        lines.append(
            md_row(
                [
                    f"`{start}`",
                    f"{b['masked_accuracy']:.3f}",
                    f"{a['masked_accuracy']:.3f}",
                    f"{b['perplexity']:.1f}",
                    f"{a['perplexity']:.1f}",
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
            "Δ average vs without MLM",
        ]
    )
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
            cells += [fmt_interval(evidence.column(s, c)) for c in COLUMNS]
            delta = (
                "(parent)"
                if origin == "original"
                else fmt_difference(evidence.average_difference(s, base_scored))
                if base_scored
                else NO_NUMBER
            )
            lines.append(md_row(cells + [delta]))
        if base_scored:
            ivs = {c: evidence.column_difference(scored, base_scored, c) for c in COLUMNS}
            notes.append(conclusion(f"{name}", m["config"], ivs))
        notes.append(provenance(m, name))
    return "\n".join(
        lines
        + [
            "",
            INTERVAL_NOTE.replace("the parent configuration", "the same configuration without MLM"),
            "",
            *notes,
        ]
    )


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
            values = [r[METRIC[c] if c != AVERAGE else AVERAGE] for r in runs]
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
        "sign shared by every seed is a consistency check, not a test.",
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
