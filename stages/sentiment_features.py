"""Stage `sentiment-features`: the frozen checkpoint's pooled vectors of the rows Table 1's
runs take, encoded once for both of a task's arms.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import sentiment_features

sentiment_features.main(sys.argv[1:])
