"""The data stage (minbert.data.prepare) on small course-shaped files."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHARED_DATA as SHARED
from coursefiles import UNVERIFIED, course_files

from minbert.data import download
from minbert.data.prepare import prepare, resolve_source
from minbert.data.problems import DataError
from minbert.data.quora_split import holdout_mask, question_groups

QUORA_ROWS = 200
BROKEN_ID = "dev-broken"  # a quora-dev row with no label, like the two in the real file
SKIP = {"quora-dev.csv": {BROKEN_ID: "no label in the course file"}}
ARGS = dict(quora_holdout_fraction=0.25, split_seed=13, skip_ids=SKIP)


@pytest.fixture
def source(tmp_path, monkeypatch) -> Path:
    """A course data directory whose files are the known course files."""
    directory = tmp_path / "cs224n"
    directory.mkdir()
    for name, body in course_files(quora_dev_rows=QUORA_ROWS, broken_quora_id=BROKEN_ID).items():
        (directory / name).write_bytes(body)
        monkeypatch.setitem(download.COURSE_SHA256, name, hashlib.sha256(body).hexdigest())
    return directory


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- resolve_source -------------------------------------------------------------


def test_resolve_source(tmp_path, monkeypatch):
    monkeypatch.delenv("MINBERT_DATA_DIR", raising=False)
    assert resolve_source("download") is None
    assert resolve_source(str(tmp_path)) == tmp_path

    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.chdir(repo)
    assert resolve_source("auto") is None  # nothing beside the repo: download
    (tmp_path / "shared" / "data" / "cs224n").mkdir(parents=True)
    assert resolve_source("auto") == Path("../shared/data/cs224n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("MINBERT_DATA_DIR", str(elsewhere))
    assert resolve_source("auto") == elsewhere


@pytest.mark.parametrize("env", [None, "no-such-dir"])
def test_resolve_source_refuses_a_missing_directory(tmp_path, monkeypatch, env):
    monkeypatch.chdir(tmp_path)
    if env:
        monkeypatch.setenv("MINBERT_DATA_DIR", env)
        request = "auto"
    else:
        request = "no-such-dir"
    with pytest.raises(DataError, match="no-such-dir.*does not exist"):
        resolve_source(request)


# --- the carved Quora split ------------------------------------------------------


def test_holdout_mask_is_exact_order_independent_and_seeded():
    ids = [f"pair-{i}" for i in range(1000)]
    held = set(pd.Series(ids)[holdout_mask(ids, 0.1, seed=3)])
    assert len(held) == 100
    shuffled = ids[:]
    random.Random(0).shuffle(shuffled)
    assert set(pd.Series(shuffled)[holdout_mask(shuffled, 0.1, seed=3)]) == held
    assert set(pd.Series(ids)[holdout_mask(ids, 0.1, seed=4)]) != held


def _chained_quora(directory: Path, monkeypatch) -> pd.DataFrame:
    """quora-dev.csv with chains of pairs sharing questions: a chain of 6 pairs
    (A-B, B-C, ... with the shared question re-spaced and re-cased), a star of 4 pairs
    around one question, a pair repeated with its questions swapped, and 60 pairs of
    their own."""
    rows = []
    chain = [f"chain question {k}" for k in range(7)]
    for k in range(6):
        second = chain[k + 1].upper() if k % 2 else "  " + chain[k + 1].replace(" ", "   ")
        rows.append((f"chain-{k}", chain[k], second))
    rows += [(f"star-{k}", "What is the hub?", f"spoke {k}") for k in range(4)]
    rows += [("swap-0", "left one", "right one"), ("swap-1", "Right one", "left   one")]
    rows += [(f"solo-{k}", f"solo a {k}", f"solo b {k}") for k in range(60)]
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow(["", "id", "sentence1", "sentence2", "is_duplicate"])
    for i, (ident, a, b) in enumerate(rows):
        writer.writerow([i, ident, a, b, f"{i % 2}.0"])
    body = out.getvalue().encode()
    (directory / "quora-dev.csv").write_bytes(body)
    monkeypatch.setitem(download.COURSE_SHA256, "quora-dev.csv", hashlib.sha256(body).hexdigest())
    return pd.DataFrame(rows, columns=["id", "sentence1", "sentence2"])


def test_question_groups_follow_chains_after_normalisation():
    frame = pd.DataFrame(
        [("a", "Q1", "q2"), ("b", "q2 ", "Q3"), ("c", "x", "y"), ("d", "Y", "z"), ("e", "lone", "other")],
        columns=["id", "s1", "s2"],
    )
    assert question_groups(frame.s1, frame.s2).tolist() == [0, 0, 1, 1, 2]


@pytest.mark.parametrize("seed", range(6))
def test_no_question_crosses_the_carved_quora_split(tmp_path, source, monkeypatch, seed):
    """Chains of pairs that share questions stay on one side, whatever the seed."""
    pairs = _chained_quora(source, monkeypatch)
    manifest = prepare(
        str(source), tmp_path / f"out{seed}", quora_holdout_fraction=0.3, split_seed=seed, skip_ids={}
    )
    train = pd.read_parquet(tmp_path / f"out{seed}" / "quora-train.parquet")
    dev = pd.read_parquet(tmp_path / f"out{seed}" / "quora-dev.parquet")

    def questions(frame):
        return {" ".join(q.split()).lower() for q in (*frame.sentence1, *frame.sentence2)}

    assert not questions(train) & questions(dev)
    assert sorted([*train.id, *dev.id]) == sorted(pairs.id)
    for family in ("chain", "star", "swap"):  # each family is one group: never split
        members = {i for i in pairs.id if i.startswith(family)}
        assert members <= set(train.id) or members <= set(dev.id), family
    split = manifest["quora_split"]
    assert split["questions_across_split"] == 0
    assert split["question_groups"] == 3 + 60 and split["largest_group_pairs"] == 6
    assert abs(len(dev) - 0.3 * len(pairs)) < 6  # within one group of the target


def test_carved_quora_split_is_deterministic_disjoint_and_complete(tmp_path, source):
    first = prepare(str(source), tmp_path / "a", **ARGS)
    prepare(str(source), tmp_path / "b", **ARGS)

    train = pd.read_parquet(tmp_path / "a" / "quora-train.parquet")
    dev = pd.read_parquet(tmp_path / "a" / "quora-dev.parquet")
    for table in ("quora-train", "quora-dev"):
        again = pd.read_parquet(tmp_path / "b" / f"{table}.parquet")
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / f"{table}.parquet"), again)

    assert set(train["id"]).isdisjoint(dev["id"])
    assert sorted([*train["id"], *dev["id"]]) == [f"dev-{i:04d}" for i in range(QUORA_ROWS)]
    assert len(dev) == round(QUORA_ROWS * ARGS["quora_holdout_fraction"])
    # Each part keeps the file's order and its line numbers.
    assert train["line"].is_monotonic_increasing and dev["line"].is_monotonic_increasing
    assert list(train.columns) == ["id", "sentence1", "sentence2", "label", "line", "group"]
    # Group numbers count over the whole file: no number names a group on both sides.
    assert set(train["group"]).isdisjoint(dev["group"]) and train["group"].dtype == "int64"

    split = first["quora_split"]
    assert split["kind"] == "carved-from-dev"
    assert (split["train_pairs"], split["heldout_pairs"]) == (len(train), len(dev))
    assert (split["holdout_fraction"], split["seed"]) == (0.25, 13)
    assert "not available" in split["note"] and "quora-dev.csv" in split["note"]
    assert not (tmp_path / "a" / "quora-test.parquet").exists()


def test_official_quora_split_when_the_train_file_is_present(tmp_path, monkeypatch):
    directory = tmp_path / "cs224n"
    directory.mkdir()
    for name, body in course_files(
        unverified_too=True, quora_dev_rows=QUORA_ROWS, broken_quora_id=BROKEN_ID
    ).items():
        (directory / name).write_bytes(body)
        if name not in UNVERIFIED:
            monkeypatch.setitem(download.COURSE_SHA256, name, hashlib.sha256(body).hexdigest())
    manifest = prepare(str(directory), tmp_path / "out", **ARGS)
    assert manifest["quora_split"] == {"kind": "official"}
    assert manifest["unavailable"] == []
    assert len(pd.read_parquet(tmp_path / "out" / "quora-dev.parquet")) == QUORA_ROWS
    assert (tmp_path / "out" / "quora-test.parquet").exists()
    assert {i["file"]: i["verified"] for i in manifest["inputs"]}["quora-train.csv"] is False


# --- manifest and tables ---------------------------------------------------------


def test_manifest_and_tables(tmp_path, source):
    out = tmp_path / "out"
    manifest = prepare(str(source), out, **ARGS)
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8")) == manifest

    assert manifest["source"] == {"kind": "directory", "requested": str(source), "path": str(source)}
    assert {i["file"]: i["sha256"] for i in manifest["inputs"]} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in source.iterdir()
    }
    assert all(i["verified"] for i in manifest["inputs"])
    assert sorted(u["file"] for u in manifest["unavailable"]) == sorted(UNVERIFIED)
    assert manifest["skipped_rows"] == [
        {
            "file": "quora-dev.csv",
            "line": QUORA_ROWS + 2,
            "id": BROKEN_ID,
            "reason": "no label in the course file",
        }
    ]

    expected_tables = {f"{t}-{s}" for t in ("sst", "cfimdb", "sts") for s in ("train", "dev", "test")}
    expected_tables |= {"quora-train", "quora-dev"}
    assert set(manifest["tables"]) == expected_tables
    assert {p.name for p in out.iterdir()} == {f"{t}.parquet" for t in expected_tables} | {"manifest.json"}
    for info in manifest["tables"].values():
        assert len(pd.read_parquet(out / info["file"])) == info["rows"]

    sst = pd.read_parquet(out / "sst-train.parquet")
    assert list(sst.columns) == ["id", "sentence", "label", "line"]
    assert sst["label"].dtype == "int64" and sst["line"].dtype == "int64"
    assert sst["sentence"].iloc[0] == ' sst train "0" part 0'
    assert pd.read_parquet(out / "sts-dev.parquet")["label"].dtype == "float64"
    assert list(pd.read_parquet(out / "sst-test.parquet").columns) == ["id", "sentence", "line"]


def test_a_second_run_replaces_the_output(tmp_path, source):
    out = tmp_path / "out"
    prepare(str(source), out, **ARGS)
    (out / "stale.txt").write_text("from an older run")
    prepare(str(source), out, **{**ARGS, "split_seed": 99})
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "manifest.json").read_text())["quora_split"]["seed"] == 99
    assert leftovers(tmp_path) == ["cs224n", "out"]


# --- failures leave nothing behind -----------------------------------------------


def test_stale_skip_id_is_an_error(tmp_path, source):
    skip = {"quora-dev.csv": {**SKIP["quora-dev.csv"], "long-gone": "fixed upstream"}}
    with pytest.raises(DataError, match="long-gone"):
        prepare(str(source), tmp_path / "out", **{**ARGS, "skip_ids": skip})
    assert leftovers(tmp_path) == ["cs224n"]


def test_skip_list_for_an_unknown_file_is_an_error(tmp_path, source):
    with pytest.raises(DataError, match="quora_dev.csv.*not a course file"):
        prepare(str(source), tmp_path / "out", **{**ARGS, "skip_ids": {"quora_dev.csv": {"x": "typo"}}})


def test_failing_inputs_leave_no_output_and_are_all_reported(tmp_path, source, monkeypatch):
    # Two bad files: both must be named in one error, and nothing written.
    for name, bad_row in (("ids-sst-dev.csv", "99\tbad\t \t7\n"), ("sts-train.csv", "99\tx\ta\tb\t9.9\n")):
        body = (source / name).read_bytes() + bad_row.encode()
        (source / name).write_bytes(body)
        monkeypatch.setitem(download.COURSE_SHA256, name, hashlib.sha256(body).hexdigest())
    with pytest.raises(DataError) as err:
        prepare(str(source), tmp_path / "out", **ARGS)
    message = str(err.value)
    assert "ids-sst-dev.csv:22: sentence is whitespace-only" in message
    assert "ids-sst-dev.csv:22: sentiment '7' is outside" in message
    assert "sts-train.csv:22: similarity '9.9' is outside" in message
    assert leftovers(tmp_path) == ["cs224n"]


def test_failure_keeps_the_previous_output(tmp_path, source):
    out = tmp_path / "out"
    before = prepare(str(source), out, **ARGS)
    (source / "sts-dev.csv").write_bytes(b"changed")
    with pytest.raises(DataError):
        prepare(str(source), out, **ARGS)
    assert json.loads((out / "manifest.json").read_text()) == before
    assert leftovers(tmp_path) == ["cs224n", "out"]


def test_checksum_mismatch_names_file_and_both_checksums(tmp_path, source):
    (source / "ids-cfimdb-dev.csv").write_bytes(b"something else")
    with pytest.raises(DataError) as err:
        prepare(str(source), tmp_path / "out", **ARGS)
    (problem,) = err.value.problems
    assert problem.path == str(source / "ids-cfimdb-dev.csv")
    assert hashlib.sha256(b"something else").hexdigest() in problem.reason
    assert download.COURSE_SHA256["ids-cfimdb-dev.csv"] in problem.reason


def test_missing_required_file_says_how_to_provide_it(tmp_path, source):
    (source / "sts-test-student.csv").unlink()
    with pytest.raises(DataError, match="sts-test-student.csv.*data.source.*MINBERT_DATA_DIR"):
        prepare(str(source), tmp_path / "out", **ARGS)
    assert leftovers(tmp_path) == ["cs224n"]


# --- the real shared data --------------------------------------------------------


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared course data not found at {SHARED}")
def test_prepare_the_real_shared_data(tmp_path):
    skip = {
        "quora-dev.csv": {
            "ad118c967d683c93883bf072d": "empty is_duplicate",
            "9054345d02cd6c5642a4904dc": "empty sentence2 and is_duplicate",
        }
    }
    manifest = prepare(str(SHARED), tmp_path / "out", quora_holdout_fraction=0.1, split_seed=0, skip_ids=skip)
    rows = {name: info["rows"] for name, info in manifest["tables"].items()}
    assert rows == {
        "sst-train": 8544, "sst-dev": 1101, "sst-test": 2210,
        "cfimdb-train": 1707, "cfimdb-dev": 245, "cfimdb-test": 488,
        "quora-train": 20212 - 2021, "quora-dev": 2021,
        "sts-train": 6040, "sts-dev": 863, "sts-test": 1725,
    }  # fmt: skip
    assert all(i["verified"] for i in manifest["inputs"])
    assert [(s["line"], s["id"]) for s in manifest["skipped_rows"]] == [
        (2577, "ad118c967d683c93883bf072d"),
        (14222, "9054345d02cd6c5642a4904dc"),
    ]
    assert manifest["quora_split"]["kind"] == "carved-from-dev"
