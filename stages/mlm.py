"""Stage `mlm@<start>`: masked-language-model pretraining (continue | scratch)."""

import sys
from pathlib import Path

from minbert import params
from minbert.train.mlm import run_stage

run_stage(
    params.load(),
    sys.argv[1],
    tokenized_dir=Path("data/tokenized"),
    out_dir=Path("models/mlm"),
    metrics_dir=Path("metrics/mlm"),
)
