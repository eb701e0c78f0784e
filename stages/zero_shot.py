"""Stage `zero-shot`: the untrained checkpoint on the full multitask dev sets."""

from pathlib import Path

from minbert import params
from minbert.train.device import pin_cpu_kernels
from minbert.zero_shot import run_stage

pin_cpu_kernels()  # before any tensor operation: the same numbers on every CPU

run_stage(
    params.load(),
    tokenized_dir=Path("data/tokenized"),
    manifest_file=Path("data/prepared/manifest.json"),
    metrics_file=Path("metrics/zero-shot.json"),
    predictions_dir=Path("predictions/zero-shot"),
)
