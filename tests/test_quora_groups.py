"""Quora's question groups: an unbiased carved split, and the ``group`` column that
follows each pair from the prepared tables into the tokenised ones."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml
from conftest import REPO
from coursefiles import course_files
from scipy import stats

from minbert.data import download
from minbert.data.batches import TokenizedTable, subsample
from minbert.data.csvfile import read_task_csv
from minbert.data.prepare import prepare
from minbert.data.quora_split import (
    GROUP_SIZE_BINS,
    carve_quora,
    holdout_mask,
    number_question_groups,
)
from minbert.data.tokenize import tokenize_prepared
from minbert.tasks import TASKS


def _size_class(sizes: np.ndarray) -> np.ndarray:
    """Index into ``GROUP_SIZE_BINS`` of each group size."""
    return np.digitize(sizes, [low for _, low, _ in GROUP_SIZE_BINS[1:]])


# --- the real course file ---------------------------------------------------------


@pytest.fixture(scope="module")
def real_split(shared_data):
    """quora-dev.csv carved as the pipeline carves it (params.yaml's fraction, seed and
    skipped rows): (manifest, train part, held-out part)."""
    path = shared_data / "quora-dev.csv"
    if not path.is_file():
        pytest.skip(f"the course's quora-dev.csv is not at {path}")
    data = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["data"]
    dev = read_task_csv(path, TASKS["quora"], skip_ids=data["skip_ids"].get("quora-dev.csv"))
    frames, origin = {("quora", "dev"): dev}, {("quora", "dev"): "quora-dev.csv"}
    manifest = carve_quora(frames, origin, data["quora_holdout_fraction"], data["split_seed"])
    return manifest, frames["quora", "train"], frames["quora", "dev"]


def test_real_split_has_the_same_duplicate_rate_on_both_sides(real_split):
    """Ranking a group by the smallest hash of its members held out large groups (mostly
    duplicates) first: 46.6% duplicates held out against 35.3% in training. With one
    hash per group the difference is a chance one; over seeds its standard deviation is
    about 1.3 points, since a single group holds up to 63 pairs."""
    manifest, train, heldout = real_split
    assert abs(heldout["label"].mean() - train["label"].mean()) <= 0.02
    for side, frame in (("train", train), ("heldout", heldout)):
        part = manifest[side]
        assert part["pairs"] == len(frame) and part["groups"] == frame["group"].nunique()
        assert part["duplicate_rate"] == round(frame["label"].mean(), 4)
        sizes = frame["group"].value_counts()
        assert part["multi_pair_group_share"] == round(sizes[sizes > 1].sum() / len(frame), 4)
        counts = np.bincount(_size_class(sizes.to_numpy()), minlength=len(GROUP_SIZE_BINS))
        assert part["groups_by_size"] == {name: int(n) for (name, _, _), n in zip(GROUP_SIZE_BINS, counts)}
    assert manifest["heldout_pairs"] + manifest["train_pairs"] == len(train) + len(heldout)
    assert manifest["train"]["groups"] + manifest["heldout"]["groups"] == manifest["question_groups"]


def test_real_split_holdout_does_not_depend_on_group_size(real_split):
    """A chi-square test of independence between a group's size class (1, 2, 3-5, 6+
    pairs) and its side, at the 1% level. Groups, not pairs, are the units: each group
    is drawn by its own hash, so groups are (nearly) independent draws, while pairs of
    one group are not. The size-biased ranking gave p below 1e-80 here."""
    _, train, heldout = real_split
    table = [
        np.bincount(_size_class(frame["group"].value_counts().to_numpy()), minlength=len(GROUP_SIZE_BINS))
        for frame in (train, heldout)
    ]
    assert stats.chi2_contingency(np.array(table)).pvalue > 0.01


# --- synthetic groups ---------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_a_groups_chance_does_not_grow_with_its_size(seed):
    """5,000 single pairs and 500 groups of 10: both kinds of group are held out at
    about the fraction asked. With 500 groups of 10 at a rate near 0.2, the binomial
    standard deviation of their held-out share is 0.018, so 0.06 is over 3 of them;
    ranking a group by its members' smallest hash held out about 36% of the large
    groups and 4% of the single pairs."""
    ids = [f"solo-{i}" for i in range(5000)] + [f"group{g}-{j}" for g in range(500) for j in range(10)]
    groups = np.concatenate([np.arange(5000), 5000 + np.repeat(np.arange(500), 10)])
    held = holdout_mask(ids, 0.2, seed, groups)
    singles, tens = held[:5000].mean(), held[5000::10].mean()  # one row per group of 10
    assert abs(singles - 0.2) < 0.03 and abs(tens - 0.2) < 0.06
    assert abs(held.mean() - 0.2) <= 10 / len(ids)  # at most one group over the target


def test_a_group_is_drawn_by_its_smallest_id():
    """A group's rank is the hash of its smallest id alone: other members may be
    added, renamed or reordered without changing which groups are held out."""
    ids = [f"pair-{i:03d}" for i in range(300)]
    groups = np.arange(300) // 3  # 100 groups of three consecutive ids
    held = holdout_mask(ids, 0.3, 5, groups)
    renamed = [i if k % 3 == 0 else f"z-{i}" for k, i in enumerate(ids)]  # smallest id kept
    assert holdout_mask(renamed, 0.3, 5, groups).tolist() == held.tolist()
    order = np.random.default_rng(0).permutation(300)
    again = holdout_mask([ids[i] for i in order], 0.3, 5, groups[order])
    assert again.tolist() == held[order].tolist()
    lowered = [f"a-{i}" if k % 3 == 2 else i for k, i in enumerate(ids)]  # a new smallest id
    assert holdout_mask(lowered, 0.3, 5, groups).tolist() != held.tolist()


# --- the group column, from prepare to the tokenised tables ---------------------------


def test_official_tables_are_numbered_together():
    """With the official split, a question shared by a train and a dev pair gives both
    the same number; otherwise numbers never repeat across tables."""
    frames = {
        ("quora", "train"): pd.DataFrame({"sentence1": ["Q1", "q2", "solo"], "sentence2": ["q2", "Q9", "x"]}),
        ("quora", "dev"): pd.DataFrame({"sentence1": ["other", "Q9 "], "sentence2": ["thing", "new"]}),
        ("sst", "train"): pd.DataFrame({"sentence": ["untouched"]}),
    }
    number_question_groups(frames)
    train, dev = frames["quora", "train"]["group"].tolist(), frames["quora", "dev"]["group"].tolist()
    assert train[0] == train[1] == dev[1] and len({train[0], train[2], dev[0]}) == 3
    assert "group" not in frames["sst", "train"]


@pytest.fixture
def tokenised(tmp_path, monkeypatch, minilm_dir):
    """Course-shaped files with question chains in quora-dev.csv, prepared (carved
    split) and tokenised: (prepared folder, tokenised folder)."""
    source = tmp_path / "cs224n"
    source.mkdir()
    files = course_files(rows=12, quora_dev_rows=60)
    # Chains: pairs 3k, 3k+1 and 3k+2 share questions, so groups have 3 pairs.
    lines = files["quora-dev.csv"].decode().splitlines()
    header, rows = lines[0], [line.split("\t") for line in lines[1:]]
    for k, row in enumerate(rows):
        row[2], row[3] = f"question {k // 3} {k % 3}", f"question {k // 3} {k % 3 + 1}"
    files["quora-dev.csv"] = "\n".join([header, *("\t".join(r) for r in rows)]).encode() + b"\n"
    for name, body in files.items():
        (source / name).write_bytes(body)
        monkeypatch.setitem(download.COURSE_SHA256, name, hashlib.sha256(body).hexdigest())
    prepared, tokenized = tmp_path / "prepared", tmp_path / "tok"
    prepare(str(source), prepared, quora_holdout_fraction=0.25, split_seed=1, skip_ids={})
    lengths = {task: 32 for task in TASKS}
    tokenize_prepared(prepared, tokenized, minilm_dir / "vocab.txt", lengths)
    return prepared, tokenized


def test_tokenised_quora_tables_keep_their_groups(tokenised):
    prepared, tokenized = tokenised
    tables = {}
    for split in ("train", "dev"):
        frame = pd.read_parquet(prepared / f"quora-{split}.parquet")
        table = TokenizedTable.read(tokenized / f"quora-{split}.parquet")
        assert table.ids == frame["id"].tolist()
        assert table.groups.dtype == np.int64 and table.groups.tolist() == frame["group"].tolist()
        assert (np.bincount(table.groups)[np.unique(table.groups)] == 3).all()  # whole groups
        tables[split] = table
    assert set(tables["train"].groups).isdisjoint(tables["dev"].groups)
    assert TokenizedTable.read(tokenized / "sts-dev.parquet").groups is None

    small = subsample(tables["train"], 10, seed=0)
    by_id = dict(zip(tables["train"].ids, tables["train"].groups.tolist()))
    assert small.groups.tolist() == [by_id[i] for i in small.ids]
    rows = np.array([4, 0, 2])
    assert tables["dev"].subset(rows).groups.tolist() == tables["dev"].groups[rows].tolist()


def test_a_group_column_that_is_not_integers_is_refused():
    table = pa.table(
        {
            "id": ["a", "b"],
            "input_ids": pa.array([[101, 102], [101, 102]], type=pa.list_(pa.int32())),
            "group": ["x", "y"],
        }
    )
    with pytest.raises(ValueError, match=r"odd.parquet: the `group` column must hold integers"):
        TokenizedTable.from_arrow(table, "odd.parquet")
