"""Stage `tokenize`: WordPiece ids of every prepared table, with the checkpoint's vocabulary."""

from pathlib import Path

from minbert.pipeline import tokenize

tokenize.main(
    settings_file=Path("data/settings/tokenize.json"),
    prepared_dir=Path("data/prepared"),
    out_dir=Path("data/tokenized"),
)
