"""Stage `sentiment@<run>`: single-task sentiment training and evaluation (Table 1)."""

import sys
from pathlib import Path

from minbert import params
from minbert.train.sentiment import run_stage

run_stage(
    params.load(),
    sys.argv[1],
    tokenized_dir=Path("data/tokenized"),
    metrics_dir=Path("metrics/sentiment"),
    predictions_dir=Path("predictions/sentiment"),
)
