"""Stage `features`: the frozen checkpoint's pooled vectors of the rows the runs take and
of dev, for the head warm-up and each run's start.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import features

features.main(sys.argv[1:])
