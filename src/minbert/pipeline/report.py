"""Stage ``report``: the paper's tables and figures regenerated from the metrics files,
the dev predictions and the prepared dev labels (``minbert.report``)."""

from __future__ import annotations

from pathlib import Path

from minbert.errors import reported
from minbert.report import write_report


@reported
def main(
    metrics_dir: Path, predictions_dir: Path, prepared_dir: Path, paper_file: Path, out_dir: Path
) -> None:
    write_report(metrics_dir, predictions_dir, prepared_dir, paper_file, out_dir)
