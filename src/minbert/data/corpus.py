"""The text MLM pretraining reads: the tasks' training splits only (never dev or test; for
Quora the carved training part), packed in file order into sequences of ``max_length``:
single sentences concatenated as ``[CLS] s1 [SEP] s2 [SEP] ...`` (a longer text cut into
pieces), pairs kept as ``[CLS] a [SEP] b [SEP]`` one per sequence (a pair too long packed
as two sentences). Every training token appears in exactly one sequence."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minbert.data.batches import Sequences, TokenizedTable
from minbert.settings import MLM_SOURCES
from minbert.tasks import TASKS


@dataclass
class Corpus:
    input_ids: Sequences
    token_type_ids: Sequences
    source: np.ndarray  # source task of each sequence

    def __len__(self) -> int:
        return len(self.input_ids)

    def subset(self, rows: np.ndarray) -> Corpus:
        return Corpus(
            Sequences.from_list([self.input_ids[i] for i in rows]),
            Sequences.from_list([self.token_type_ids[i] for i in rows]),
            self.source[rows],
        )

    def counts(self) -> dict[str, int]:
        names, counts = np.unique(self.source, return_counts=True)
        return {str(n): int(c) for n, c in zip(names, counts)}


def _content(ids: np.ndarray, cls_id: int, sep_id: int) -> np.ndarray:
    # Tokenised sentences are stored as [CLS] ... [SEP]; packing re-adds the markers.
    start = 1 if len(ids) and ids[0] == cls_id else 0
    end = len(ids) - 1 if len(ids) > start and ids[-1] == sep_id else len(ids)
    return ids[start:end]


def pack_sentences(
    texts: Iterable[np.ndarray], max_length: int, cls_id: int, sep_id: int
) -> Iterator[np.ndarray]:
    """Greedy packing of sentences (content tokens, no markers) into sequences."""
    if max_length < 3:
        raise ValueError(f"max_length must be at least 3, got {max_length}")
    current = [cls_id]
    for text in texts:
        pieces = [text[i : i + max_length - 2] for i in range(0, len(text), max_length - 2)]
        for piece in pieces:
            if len(current) + len(piece) + 1 > max_length:
                yield np.array(current, dtype=np.int64)
                current = [cls_id]
            current.extend(int(t) for t in piece)
            current.append(sep_id)
    if len(current) > 1:
        yield np.array(current, dtype=np.int64)


def build_corpus(
    tokenized_dir: Path,
    sources: Iterable[str],
    max_length: int,
    *,
    cls_id: int,
    sep_id: int,
) -> Corpus:
    ids: list[np.ndarray] = []
    types: list[np.ndarray] = []
    origin: list[str] = []
    for source in sources:
        if source not in MLM_SOURCES:
            raise ValueError(f"unknown corpus source {source!r}; allowed: {list(MLM_SOURCES)}")
        table = TokenizedTable.read(Path(tokenized_dir) / f"{source}-train.parquet")
        if not TASKS[source].is_pair:
            seqs = table.sequences["input_ids"]
            texts = (_content(seqs[i], cls_id, sep_id) for i in range(len(seqs)))
            for packed in pack_sentences(texts, max_length, cls_id, sep_id):
                ids.append(packed)
                types.append(np.zeros_like(packed))
                origin.append(source)
            continue
        pair, pair_types = table.sequences["pair_input_ids"], table.sequences["pair_token_type_ids"]
        too_long = []
        for i in range(len(pair)):
            if len(pair[i]) <= max_length:
                ids.append(pair[i].astype(np.int64))
                types.append(pair_types[i].astype(np.int64))
                origin.append(source)
            else:
                too_long.append(i)
        first, second = table.sequences["input_ids_1"], table.sequences["input_ids_2"]
        texts = (_content(side[i], cls_id, sep_id) for i in too_long for side in (first, second))
        for packed in pack_sentences(texts, max_length, cls_id, sep_id):
            ids.append(packed)
            types.append(np.zeros_like(packed))
            origin.append(source)
    if not ids:
        raise ValueError(f"{tokenized_dir}: the pretraining corpus is empty")
    return Corpus(Sequences.from_list(ids), Sequences.from_list(types), np.array(origin))
