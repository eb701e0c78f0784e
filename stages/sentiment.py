"""Stage `sentiment@<run>`: single-task sentiment training and evaluation (Table 1)."""

import sys
from pathlib import Path

from minbert.pipeline import sentiment

sentiment.main(
    sys.argv[1:],
    settings_dir=Path("data/settings/sentiment"),
    tokenized_dir=Path("data/tokenized"),
    metrics_dir=Path("metrics/sentiment"),
    predictions_dir=Path("predictions/sentiment"),
)
