"""Stage `mlm@<start>`: masked-language-model pretraining (continue | scratch)."""

import sys
from pathlib import Path

from minbert import params
from minbert.train.device import pin_cpu_kernels
from minbert.train.mlm import run_stage

pin_cpu_kernels()  # before any tensor operation: the same numbers on every CPU

run_stage(
    params.load(),
    sys.argv[1],
    tokenized_dir=Path("data/tokenized"),
    out_dir=Path("models/mlm"),
    metrics_dir=Path("metrics/mlm"),
)
