"""Tokenisation to Parquet: columns, pair packing, truncation, no silent loss."""

import json

import pandas as pd
import pytest

from minbert.data.batches import TokenizedTable
from minbert.data.tokenize import tokenize_prepared


def _prepare(tmp_path):
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    pd.DataFrame(
        {"id": ["a", "b"], "sentence": ["A fine film .", "word " * 50], "label": [3, 0], "line": [2, 3]}
    ).to_parquet(prepared / "sst-train.parquet")
    pd.DataFrame(
        {
            "id": ["p"],
            "sentence1": ["How old are you?"],
            "sentence2": ["What is your age?"],
            "label": [4.2],
            "line": [2],
        }
    ).to_parquet(prepared / "sts-dev.parquet")
    return prepared


def test_columns_and_pairs(tmp_path, minilm_dir):
    stats = tokenize_prepared(
        _prepare(tmp_path), tmp_path / "tok", minilm_dir / "vocab.txt", {"sst": 16, "sts": 32}
    )
    sst = TokenizedTable.read(tmp_path / "tok" / "sst-train.parquet")
    assert sst.ids == ["a", "b"] and sst.labels.tolist() == [3, 0]
    first = sst.sequences["input_ids"][0].tolist()
    assert first[0] == 101 and first[-1] == 102 and len(first) == 6  # [CLS] a fine film . [SEP]
    assert len(sst.sequences["input_ids"][1]) == 16  # truncated to max_length
    assert stats["tables"]["sst-train"]["truncated"] == 1

    sts = TokenizedTable.read(tmp_path / "tok" / "sts-dev.parquet")
    a, b = sts.sequences["input_ids_1"][0], sts.sequences["input_ids_2"][0]
    pair = sts.sequences["pair_input_ids"][0]
    types = sts.sequences["pair_token_type_ids"][0]
    assert pair.tolist() == a.tolist() + b.tolist()[1:]  # [CLS] a [SEP] b [SEP]
    assert types.tolist() == [0] * len(a) + [1] * (len(b) - 1)
    saved = json.loads((tmp_path / "tok" / "stats.json").read_text())
    assert saved["tables"]["sts-dev"]["rows"] == 1 and "vocab_sha256" in saved


def test_unknown_task_and_missing_length(tmp_path, minilm_dir):
    prepared = _prepare(tmp_path)
    with pytest.raises(ValueError, match="no entry for task 'sts'"):
        tokenize_prepared(prepared, tmp_path / "tok", minilm_dir / "vocab.txt", {"sst": 16})
    assert not (tmp_path / "tok").exists()  # nothing half-written
    with pytest.raises(ValueError, match="unknown task"):
        tokenize_prepared(
            prepared, tmp_path / "tok", minilm_dir / "vocab.txt", {"sst": 16, "sts": 16, "imdb": 3}
        )


def test_tokenized_table_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"absent.parquet: no such tokenised table.*dvc repro tokenize"
    ):
        TokenizedTable.read(tmp_path / "absent.parquet")
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match=r"garbage.parquet: not a readable Parquet table"):
        TokenizedTable.read(tmp_path / "garbage.parquet")
    pd.DataFrame({"sentence": ["a"]}).to_parquet(tmp_path / "foreign.parquet")
    with pytest.raises(ValueError, match=r"foreign.parquet: no `id` column"):
        TokenizedTable.read(tmp_path / "foreign.parquet")
    pd.DataFrame({"id": ["a"], "label": [1]}).to_parquet(tmp_path / "noids.parquet")
    with pytest.raises(ValueError, match=r"noids.parquet: no token-id columns"):
        TokenizedTable.read(tmp_path / "noids.parquet")


def test_bad_prepared_tables_are_named_and_leave_no_output(tmp_path, minilm_dir):
    prepared = _prepare(tmp_path)
    (prepared / "sst-dev.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"sst-dev.parquet: not a readable Parquet table.*dvc repro prepare"):
        tokenize_prepared(prepared, tmp_path / "tok", minilm_dir / "vocab.txt", {"sst": 16, "sts": 16})
    assert not (tmp_path / "tok").exists()
    pd.DataFrame({"id": ["a"], "text": ["x"]}).to_parquet(prepared / "sst-dev.parquet")
    with pytest.raises(ValueError, match=r"sst-dev.parquet: missing column\(s\) \['sentence'\]"):
        tokenize_prepared(prepared, tmp_path / "tok", minilm_dir / "vocab.txt", {"sst": 16, "sts": 16})
