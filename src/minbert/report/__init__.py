"""The report: the paper's tables and figures from this pipeline's metrics files, each
number with a bootstrap interval from its stage's dev predictions, beside the published
numbers. What each table and figure shows is data in ``reference/paper.yaml``; a run not
made shows "not run" and a figure without inputs names the missing files; a run without
the keys the report reads must be regenerated. Assembled by ``minbert.report.writer``."""

from minbert.report.writer import write_report

__all__ = ["write_report"]
