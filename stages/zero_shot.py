"""Stage `zero-shot`: the untrained checkpoint on the full multitask dev sets."""

from pathlib import Path

from minbert.pipeline import zero_shot

zero_shot.main(
    settings_file=Path("data/settings/zero-shot.json"),
    tokenized_dir=Path("data/tokenized"),
    manifest_file=Path("data/prepared/manifest.json"),
    metrics_file=Path("metrics/zero-shot.json"),
    predictions_dir=Path("predictions/zero-shot"),
)
