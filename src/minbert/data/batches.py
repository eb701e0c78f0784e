"""From tokenised Parquet tables to padded batches, drawn from buckets of similar length
and padded only to their own longest row (padding is the largest waste on short
sentences); the buckets are reshuffled every epoch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from minbert.data.strata import label_strata, stratified_choice


@dataclass
class Sequences:
    """Variable-length token sequences stored flat (one array plus offsets)."""

    flat: np.ndarray
    offsets: np.ndarray  # len(self) + 1 entries

    @classmethod
    def from_arrow(cls, column) -> Sequences:
        column = column.combine_chunks()
        offsets = column.offsets.to_numpy().astype(np.int64)
        flat = column.values.to_numpy().astype(np.int64)
        # Slices of a chunk keep their parent's offsets: rebase to zero.
        return cls(flat[offsets[0] : offsets[-1]], offsets - offsets[0])

    @classmethod
    def from_list(cls, items: Sequence[np.ndarray]) -> Sequences:
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(x) for x in items])
        flat = np.concatenate(items) if len(items) else np.zeros(0, dtype=np.int64)
        return cls(flat.astype(np.int64), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i] : self.offsets[i + 1]]


@dataclass
class TokenizedTable:
    """One tokenised split: ids, optional labels, sequence columns, and each row's question
    group where the table has one (Quora: pairs sharing a question stay on one side)."""

    ids: list[str]
    labels: np.ndarray | None
    sequences: dict[str, Sequences]
    groups: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def read(cls, path: Path) -> TokenizedTable:
        """Read a table written by the tokenize stage; a missing, unreadable or
        foreign file is an error naming it and saying how to rebuild it."""
        path = Path(path)
        rebuild = "rebuild it with `dvc repro tokenize`"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no such tokenised table (looked for {path.absolute()}); {rebuild}"
            )
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{path}: not a readable Parquet table ({exc}); {rebuild}") from None
        return cls.from_arrow(table, f"{path}", f"; {rebuild}")

    @classmethod
    def from_arrow(cls, table: pa.Table, where: str = "table", advice: str = "") -> TokenizedTable:
        """A tokenised table from its Arrow form (what ``minbert.data.tokenize`` makes)."""
        if "id" not in table.column_names:
            raise ValueError(f"{where}: no `id` column (found {table.column_names}){advice}")
        sequences = {
            name: Sequences.from_arrow(table.column(name))
            for name in table.column_names
            if name.endswith("input_ids") or name.startswith(("input_ids", "pair_token_type"))
        }
        if not sequences:
            raise ValueError(f"{where}: no token-id columns (found {table.column_names}){advice}")
        labels = np.array(table.column("label")) if "label" in table.column_names else None
        groups = None
        if "group" in table.column_names:
            column = table.column("group")
            if not pa.types.is_integer(column.type) or column.null_count:
                raise ValueError(
                    f"{where}: the `group` column must hold integers with no nulls, "
                    f"found {column.type} with {column.null_count} nulls{advice}"
                )
            groups = column.to_numpy().astype(np.int64)
        return cls([str(x) for x in table.column("id").to_pylist()], labels, sequences, groups)

    def subset(self, rows: np.ndarray) -> TokenizedTable:
        """A copy holding only ``rows`` (in that order)."""
        return TokenizedTable(
            [self.ids[i] for i in rows],
            None if self.labels is None else self.labels[rows],
            {name: Sequences.from_list([seq[i] for i in rows]) for name, seq in self.sequences.items()},
            None if self.groups is None else self.groups[rows],
        )


def subsample(table: TokenizedTable, n: int, seed: int) -> TokenizedTable:
    """A seeded random subset of ``n`` rows (kept in file order), each label its share
    (``minbert.data.strata``); all rows when n is 0."""
    if n == 0 or n >= len(table):
        return table
    rng = np.random.default_rng(seed)
    if table.labels is None:
        return table.subset(np.sort(rng.choice(len(table), size=n, replace=False)))
    return table.subset(stratified_choice(label_strata(table.labels), n, rng))


def length_bucketed_batches(
    lengths: np.ndarray,
    batch_size: int,
    *,
    shuffle: bool,
    generator: np.random.Generator | None = None,
    bucket_batches: int = 50,
) -> list[np.ndarray]:
    """Row indices in batches of similar length, every row once. With ``shuffle``: shuffle,
    sort windows of ``bucket_batches`` batches by length, cut, shuffle the batches;
    without (evaluation): sorted by length."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = len(lengths)
    if not shuffle:
        order = np.argsort(lengths, kind="stable")
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if generator is None:
        raise ValueError("a shuffled batch order needs a seeded numpy Generator")
    order = generator.permutation(n)
    window = batch_size * bucket_batches
    batches = []
    for start in range(0, n, window):
        chunk = order[start : start + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in generator.permutation(len(batches))]


def split_by_tokens(rows: np.ndarray, lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """A batch cut, in order, into pieces of at most ``max_tokens`` padded tokens (0: no
    limit; a longer row is a piece of its own), so that a step's activations fit (long
    reviews); gradients accumulate over the pieces."""
    if max_tokens <= 0 or len(rows) * int(lengths[rows].max()) <= max_tokens:
        return [rows]
    pieces, start, longest = [], 0, 0
    for i, row in enumerate(rows):
        longest_with = max(longest, int(lengths[row]))
        if i > start and (i - start + 1) * longest_with > max_tokens:
            pieces.append(rows[start:i])
            start, longest_with = i, int(lengths[row])
        longest = longest_with
    pieces.append(rows[start:])
    return pieces


def random_batches(n: int, batch_size: int, generator: np.random.Generator) -> list[np.ndarray]:
    """Plain shuffled batches (for comparison with bucketing in benchmarks)."""
    order = generator.permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def pad(
    seqs: Sequences, rows: np.ndarray, pad_id: int = 0, multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``rows`` of ``seqs`` into (ids, attention_mask), padded to their longest
    rounded up to a multiple of ``multiple`` (repeating shapes for a GPU)."""
    lengths = seqs.lengths()[rows]
    width = -(-int(lengths.max()) // multiple) * multiple
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    for j, i in enumerate(rows):
        ids[j, : lengths[j]] = seqs[i]
    mask = np.arange(width)[None, :] < lengths[:, None]
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))
