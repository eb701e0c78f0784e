"""Stage ``tokenize``: WordPiece ids of every prepared table, with the checkpoint's
vocabulary (settings: ``data/settings/tokenize.json``)."""

from __future__ import annotations

from pathlib import Path

from minbert.data.tokenize import tokenize_prepared
from minbert.errors import reported
from minbert.model.checkpoint import resolve_checkpoint
from minbert.pipeline.outputs import read_settings


@reported
def main(settings_file: Path, prepared_dir: Path, out_dir: Path) -> dict:
    resolved = read_settings(settings_file)
    return tokenize_prepared(
        prepared_dir,
        out_dir,
        resolve_checkpoint(resolved["checkpoint"]) / "vocab.txt",
        resolved["max_length"],
    )
