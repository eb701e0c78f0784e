"""Stage `multitask@<config>`: multitask fine-tuning of one configuration (Tables 2-4).

Also stage `multitask-mlm@<start>-<config>`: the same configuration fine-tuned from
the checkpoint written by stage `mlm@<start>` (second argument).
"""

import sys
from pathlib import Path

from minbert.pipeline import multitask

multitask.main(
    sys.argv[1:],
    settings_dir=Path("data/settings/multitask"),
    tokenized_dir=Path("data/tokenized"),
    manifest_file=Path("data/prepared/manifest.json"),
    metrics_root=Path("metrics"),
    predictions_root=Path("predictions"),
    models_root=Path("models"),
)
