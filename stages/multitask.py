"""Stage `multitask@<config>`: multitask fine-tuning of one configuration (Tables 2-4).

Also stage `multitask-mlm@<start>-<config>`: the same configuration fine-tuned from
the checkpoint written by stage `mlm@<start>` (second argument).
"""

import sys
from pathlib import Path

from minbert import params
from minbert.train.device import pin_cpu_kernels
from minbert.train.multitask import run_stage

pin_cpu_kernels()  # before any tensor operation: the same numbers on every CPU

config, mlm_start = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
run_stage(
    params.load(),
    config,
    tokenized_dir=Path("data/tokenized"),
    manifest_file=Path("data/prepared/manifest.json"),
    metrics_dir=Path("metrics/multitask" if mlm_start is None else "metrics/multitask-mlm"),
    predictions_dir=Path("predictions/multitask" if mlm_start is None else "predictions/multitask-mlm"),
    mlm_dir=None if mlm_start is None else Path("models/mlm") / mlm_start,
)
