"""Stage `sentiment@<run>`: single-task sentiment training and evaluation (Table 1)."""

import sys
from pathlib import Path

from minbert import params
from minbert.train.device import pin_cpu_kernels
from minbert.train.sentiment import run_stage

pin_cpu_kernels()  # before any tensor operation: the same numbers on every CPU

run_stage(
    params.load(),
    sys.argv[1],
    tokenized_dir=Path("data/tokenized"),
    metrics_dir=Path("metrics/sentiment"),
    predictions_dir=Path("predictions/sentiment"),
)
