"""Stage `multitask@<config>`: multitask fine-tuning of one configuration (Tables 2-4)."""

import sys
from pathlib import Path

from minbert import params
from minbert.train.multitask import run_stage

run_stage(
    params.load(),
    sys.argv[1],
    tokenized_dir=Path("data/tokenized"),
    manifest_file=Path("data/prepared/manifest.json"),
    metrics_dir=Path("metrics/multitask"),
    predictions_dir=Path("predictions/multitask"),
)
