"""The cells of the report's tables: number formats, Markdown rows, each run's evidence,
and the one sentence a paired difference allows."""

from __future__ import annotations

from minbert.metrics import AVERAGE, METRIC, METRIC_TITLE, MULTITASK_TASKS, Interval
from minbert.report.evidence import Evidence, Scored

TASK_NAMES = {"sst": "SST (5 classes)", "cfimdb": "CFIMDB (2 classes)"}
MODE_NAMES = {"last-layer": "last layer only", "full": "full fine-tuning"}
TASK_TITLES = {"sst": "SST", "quora": "Quora", "sts": "STS", "cfimdb": "CFIMDB"}
COLUMNS = [*MULTITASK_TASKS, AVERAGE]
COLUMN_TITLES = {**METRIC_TITLE, AVERAGE: "Average"}
SOURCE_NAMES = {
    "quora": "the Quora question-pairs release",
    "sts": "the STS benchmark",
    "sst": "the Stanford Sentiment Treebank",
    "cfimdb": "IMDB reviews",
}
NO_NUMBER = "—"  # a number the source lacks
INTERVAL_NOTE = (
    "Ours: the number on the full dev set, with its 95% interval from a bootstrap over the "
    "dev examples (9,999 resamples, percentile method; the average resamples each task's "
    "examples on its own). Δ: ours minus the parent configuration on the same examples, "
    "with a 95% paired-bootstrap interval; **bold** marks an interval that excludes zero. "
    "Differences whose interval contains zero are not distinguishable on these dev sets, "
    "and the table does not rank them."
)


def fmt(x: float | None) -> str:
    return NO_NUMBER if x is None else f"{x:.3f}"


def fmt_interval(iv: Interval) -> str:
    return f"{iv.value:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def fmt_difference(iv: Interval) -> str:
    text = f"{iv.value:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"
    return f"**{text}**" if iv.excludes_zero else text


def md_row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def md_header(cells: list[str]) -> list[str]:
    return [md_row(cells), "|" + "---|" * len(cells)]


def multitask_scored(evidence: Evidence, folder: str, name: str, metrics: dict) -> Scored:
    """A multitask-style run's evidence: ``<folder>/<name>/<task>-dev-out.csv``."""
    prefix = f"{folder}/{name}/" if name else f"{folder}/"
    return evidence.scored(
        f"{folder}/{name}".rstrip("/"),
        {t: f"{prefix}{t}-dev-out.csv" for t in MULTITASK_TASKS},
        {t: metrics[METRIC[t]] for t in MULTITASK_TASKS},
    )


def conclusion(name: str, parent: str, ivs: dict[str, Interval]) -> str:
    apart = [
        f"{COLUMN_TITLES[c]} {'higher' if ivs[c].value > 0 else 'lower'} by {abs(ivs[c].value):.3f}"
        for c in COLUMNS
        if ivs[c].excludes_zero
    ]
    if not apart:
        return f"- `{name}` vs `{parent}`: no difference is distinguishable from zero."
    same = [COLUMN_TITLES[c] for c in COLUMNS if not ivs[c].excludes_zero]
    tail = f"; {', '.join(same)}: not distinguishable" if same else ""
    return f"- `{name}` vs `{parent}`: {'; '.join(apart)}{tail}."
