"""Stage ``report``: the paper's tables and figures regenerated from the metrics files,
the dev predictions and the prepared dev labels (``minbert.report``); ``params.yaml``
says what chose the learning rates and epochs of the scales the runs were not made at."""

from __future__ import annotations

from pathlib import Path

from minbert.errors import reported
from minbert.pipeline.entry import paths
from minbert.report import write_report


@reported
def main(argv: list[str]) -> None:
    """The stage script's work; its paths come from dvc.yaml's cmd (``--params``: the
    scales the runs were not made at, for "What chose what"; ``--smart-measurement``:
    ``bench/smart_collapse.py``'s result; ``--smart-norm``: ``bench/smart_norm.py``'s;
    ``--warmup-cap``: ``bench/warmup_cap.py``'s; ``--cross-cpu``: ``bench/cross_cpu.py``'s;
    ``--size-choices``: the benchmarks' results that chose the cpu scale's sizes, whose
    seeds the first page names;
    ``--sources``: the repository root, whose code the GPU results ran with or not)."""
    given = paths(
        argv,
        "metrics",
        "predictions",
        "prepared",
        "paper",
        "out",
        optional=("params", "smart-measurement", "smart-norm", "warmup-cap", "cross-cpu", "sources"),
        several=("size-choices",),
    )
    write_report(
        given["metrics"],
        given["predictions"],
        given["prepared"],
        given["paper"],
        given["out"],
        given["params"],
        smart_file=given["smart_measurement"],
        smart_norm_file=given["smart_norm"],
        cross_cpu_file=given["cross_cpu"],
        warmup_cap_file=given["warmup_cap"],
        size_choice_files=given["size_choices"],
        sources=given["sources"] or Path("."),
    )
