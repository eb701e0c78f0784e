"""Stage `features`: the frozen checkpoint's pooled vectors of every training row, for
the head warm-up.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import features

features.main(sys.argv[1:])
