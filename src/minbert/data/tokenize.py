"""WordPiece tokenisation of the prepared tables, once, into Parquet with the same rows:
single sentences as ``input_ids`` and ``length``; pairs as each sentence apart
(``input_ids_1/2``, ``length_1/2``, siamese) and packed (``pair_input_ids``,
``pair_token_type_ids``, ``pair_length``, cross-encoder). ``length`` counts real tokens;
a ``group`` column is kept."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import BertWordPieceTokenizer

from minbert.atomic import atomic_directory
from minbert.data.download import sha256_file
from minbert.tasks import TASKS

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def load_tokenizer(vocab_file: Path, *, lowercase: bool = True) -> BertWordPieceTokenizer:
    vocab = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise ValueError(f"{vocab_file}: vocabulary lacks special tokens {missing}")
    return BertWordPieceTokenizer(str(vocab_file), lowercase=lowercase)


def _ids_column(encodings, attr: str = "ids") -> pa.Array:
    # int32 halves the Parquet size of int64 ids; vocabularies are far below 2**31.
    return pa.array([getattr(e, attr) for e in encodings], type=pa.list_(pa.int32()))


def tokenize_table(
    table: pd.DataFrame, task: str, tokenizer: BertWordPieceTokenizer, max_length: int
) -> tuple[pa.Table, dict]:
    """Tokenise one prepared table; return the Arrow table and truncation statistics."""
    spec = TASKS[task]
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    columns: dict[str, pa.Array] = {"id": pa.array(table["id"].astype(str))}
    if "label" in table:
        columns["label"] = pa.array(table["label"].to_numpy())
    if "group" in table:  # Quora's question groups: for group-aware splits and bootstraps
        columns["group"] = pa.array(table["group"].to_numpy(), type=pa.int64())
    stats: dict = {"rows": len(table), "max_length": max_length}

    def encode(texts: list[str], pairs: list[str] | None = None):
        batch = list(zip(texts, pairs)) if pairs is not None else texts
        encodings = tokenizer.encode_batch(batch)
        truncated = sum(1 for e in encodings if e.overflowing)
        return encodings, truncated

    if len(spec.text_columns) == 1:
        enc, stats["truncated"] = encode(table[spec.text_columns[0]].tolist())
        columns["input_ids"] = _ids_column(enc)
        columns["length"] = pa.array([len(e.ids) for e in enc], type=pa.int32())
    else:
        first, second = (table[c].tolist() for c in spec.text_columns)
        for suffix, texts in (("_1", first), ("_2", second)):
            enc, stats[f"truncated{suffix}"] = encode(texts)
            columns[f"input_ids{suffix}"] = _ids_column(enc)
            columns[f"length{suffix}"] = pa.array([len(e.ids) for e in enc], type=pa.int32())
        enc, stats["truncated_pair"] = encode(first, second)
        columns["pair_input_ids"] = _ids_column(enc)
        columns["pair_token_type_ids"] = pa.array([e.type_ids for e in enc], type=pa.list_(pa.int8()))
        columns["pair_length"] = pa.array([len(e.ids) for e in enc], type=pa.int32())
    return pa.table(columns), stats


def _read_prepared(path: Path, task: str) -> pd.DataFrame:
    """A table of the prepare stage, with the columns its task needs, or a clear error."""
    rebuild = "rebuild it with `dvc repro prepare`"
    try:
        frame = pd.read_parquet(path)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path}: not a readable Parquet table ({exc}); {rebuild}") from None
    missing = [c for c in ("id", *TASKS[task].text_columns) if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing} (found {list(frame.columns)}); {rebuild}")
    return frame


def tokenize_prepared(
    prepared_dir: Path, out_dir: Path, vocab_file: Path, max_length: dict[str, int]
) -> dict:
    """Tokenise every prepared table; write Parquet files and ``stats.json``."""
    prepared_dir, out_dir = Path(prepared_dir), Path(out_dir)
    unknown = sorted(set(max_length) - set(TASKS))
    if unknown:
        raise ValueError(f"tokenize.max_length: unknown task(s) {unknown}; allowed: {sorted(TASKS)}")
    tokenizer = load_tokenizer(vocab_file)
    files = sorted(prepared_dir.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"{prepared_dir}: no prepared tables (run the prepare stage first)")
    # The vocabulary's checksum, not its path: the output must not depend on where
    # the checkpoint happens to be installed.
    stats: dict = {"vocab_sha256": sha256_file(vocab_file), "tables": {}}
    with atomic_directory(out_dir) as tmp:
        for path in files:
            task = path.stem.rsplit("-", 1)[0]
            if task not in TASKS:
                raise ValueError(f"{path}: file name does not start with a known task {sorted(TASKS)}")
            if task not in max_length:
                raise ValueError(f"tokenize.max_length has no entry for task {task!r}")
            table, table_stats = tokenize_table(_read_prepared(path, task), task, tokenizer, max_length[task])
            pq.write_table(table, tmp / path.name)
            stats["tables"][path.stem] = table_stats
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats
