"""Stage `report`: regenerate the paper's tables and figures from the metrics and predictions."""

from pathlib import Path

from minbert.pipeline import report

report.main(
    metrics_dir=Path("metrics"),
    predictions_dir=Path("predictions"),
    prepared_dir=Path("data/prepared"),
    paper_file=Path("reference/paper.yaml"),
    out_dir=Path("report"),
)
