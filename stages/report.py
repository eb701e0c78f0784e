"""Stage `report`: regenerate the paper's tables and figures from the metrics and predictions.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import report

report.main(sys.argv[1:])
