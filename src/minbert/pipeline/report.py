"""Stage ``report``: the paper's tables and figures regenerated from the metrics files,
the dev predictions and the prepared dev labels (``minbert.report``); ``params.yaml``
says what chose the learning rates and epochs of the scales the runs were not made at."""

from __future__ import annotations

from pathlib import Path

from minbert.errors import reported
from minbert.report import write_report


@reported
def main(
    metrics_dir: Path,
    predictions_dir: Path,
    prepared_dir: Path,
    paper_file: Path,
    out_dir: Path,
    params_file: Path = Path("params.yaml"),
) -> None:
    write_report(metrics_dir, predictions_dir, prepared_dir, paper_file, out_dir, params_file)
