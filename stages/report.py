"""Stage `report`: regenerate the paper's tables from the metrics files."""

from pathlib import Path

from minbert.report import write_report

write_report(metrics_dir=Path("metrics"), paper_file=Path("reference/paper.yaml"),
             out_dir=Path("report"))
