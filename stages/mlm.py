"""Stage `mlm@<start>`: masked-language-model pretraining (continue | scratch)."""

import sys
from pathlib import Path

from minbert.pipeline import mlm

mlm.main(
    sys.argv[1:],
    settings_dir=Path("data/settings/mlm"),
    tokenized_dir=Path("data/tokenized"),
    out_dir=Path("models/mlm"),
    metrics_dir=Path("metrics/mlm"),
)
