"""Stage `sentiment@<run>`: single-task sentiment training and evaluation (Table 1).

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import sentiment

sentiment.main(sys.argv[1:])
