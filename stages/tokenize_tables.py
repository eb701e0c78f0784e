"""Stage `tokenize`: WordPiece ids of every prepared table, with the checkpoint's vocabulary."""

from pathlib import Path

from minbert import params
from minbert.data.tokenize import tokenize_prepared
from minbert.model.checkpoint import resolve_checkpoint

p = params.load()
tokenize_prepared(
    Path("data/prepared"),
    Path("data/tokenized"),
    resolve_checkpoint(p["checkpoint"]) / "vocab.txt",
    params.scale(p)["max_length"],
)
