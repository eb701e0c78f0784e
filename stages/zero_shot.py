"""Stage `zero-shot`: the untrained checkpoint on the full multitask dev sets.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import zero_shot

zero_shot.main(sys.argv[1:])
