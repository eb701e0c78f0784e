"""The report: the paper's tables and figures regenerated from this pipeline's outputs.

Every number in the report is read from a metrics file that a pipeline stage wrote
(its record says how it was produced, ``minbert.results``), with an interval
bootstrapped from that stage's dev predictions (``minbert.report.evidence``); the
report says which checkpoint, data split, seed, scale and device produced it, and
sets the published numbers (``reference/paper.yaml``) beside it.

What each table and figure shows (which configurations, in which order, with which
labels, compared with which parent) is data in ``reference/paper.yaml``, so adding
a row or a figure needs no change here; a configuration no table names is shown in
"Other configurations". A configuration that was not run shows as "not run" in a
table, and a figure whose inputs are missing is replaced by a line naming the
missing files: a partial pipeline still gets a report. Only having no metrics at all
is an error, and so is a run without the keys the report reads (``writer.RUN_KEYS``,
``writer.SENTIMENT_KEYS``): written before the stage recorded its training budget, its
chance-corrected dev scores or its start, it has to be regenerated (``dvc repro``), not
shown half-empty.

The document itself is assembled by ``minbert.report.writer``.
"""

from minbert.report.writer import write_report

__all__ = ["write_report"]
