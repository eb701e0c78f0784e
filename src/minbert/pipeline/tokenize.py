"""Stage ``tokenize``: WordPiece ids of every prepared table, with the checkpoint's
vocabulary (settings: ``data/settings/tokenize.json``)."""

from __future__ import annotations

from pathlib import Path

from minbert.data.tokenize import tokenize_prepared
from minbert.model.checkpoint import resolve_checkpoint
from minbert.pipeline.entry import stage_main


def run(resolved: dict, prepared: Path, out: Path) -> dict:
    """Tokenise every prepared table under ``prepared`` into ``out`` with the configured
    checkpoint's vocabulary and the scale's lengths (``resolved``: tokenize.json)."""
    vocabulary = resolve_checkpoint(resolved["checkpoint"]) / "vocab.txt"
    return tokenize_prepared(prepared, out, vocabulary, resolved["max_length"])


main = stage_main(run, "prepared", "out")
