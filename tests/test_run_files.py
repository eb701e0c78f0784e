"""The run files typed both ways (``minbert.runs.training``): every committed run, of the
cpu study and of the GPU study, read into its dataclass and written back gives its files'
bytes, so the stages (which write through the same dataclasses) and the report (which
reads through them) agree on every key; a file of another version is named in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from minbert.results import is_record, metrics_file, record_file
from minbert.runs.training import (
    MlmRunFile,
    MultitaskRunFile,
    SentimentRunFile,
    ZeroShotRunFile,
    read_run,
    write_run,
)

REPO = Path(__file__).resolve().parents[1]
KINDS = {
    "multitask": MultitaskRunFile,
    "multitask-mlm": MultitaskRunFile,
    "sentiment": SentimentRunFile,
    "mlm": MlmRunFile,
}


def _committed() -> list[tuple[type, Path]]:
    runs = []
    for metrics in (REPO / "metrics", REPO / "metrics" / "gpu" / "metrics"):
        runs += [(ZeroShotRunFile, p) for p in [metrics / "zero-shot.json"] if p.is_file()]
        for folder, kind in KINDS.items():
            runs += [(kind, p) for p in sorted((metrics / folder).glob("*.json")) if not is_record(p)]
    return runs


COMMITTED = _committed()


def test_every_kind_of_run_is_committed():
    kinds = {kind for kind, _ in COMMITTED}
    assert kinds == {MultitaskRunFile, SentimentRunFile, ZeroShotRunFile, MlmRunFile}, kinds
    assert len(COMMITTED) >= 30


@pytest.mark.parametrize("kind,path", COMMITTED, ids=[str(p.relative_to(REPO)) for _, p in COMMITTED])
def test_a_committed_run_written_back_is_byte_identical(kind, path, tmp_path):
    run = read_run(kind, path)
    name = path.name[: -len(".json")]
    write_run(run, tmp_path, name)
    for written, committed in (
        (metrics_file(tmp_path, name), path),
        (record_file(tmp_path, name), record_file(path.parent, name)),
    ):
        assert written.read_bytes() == committed.read_bytes(), committed
    assert read_run(kind, metrics_file(tmp_path, name)) == run


def test_a_file_of_another_version_is_named_in_one_line(tmp_path):
    kind, path = next((k, p) for k, p in COMMITTED if k is MultitaskRunFile)
    run = read_run(kind, path)
    write_run(run, tmp_path, "old")
    record = json.loads(record_file(tmp_path, "old").read_text())
    record["renamed_key"] = record.pop("selection")
    record_file(tmp_path, "old").write_text(json.dumps(record))
    with pytest.raises(ValueError) as raised:
        read_run(kind, metrics_file(tmp_path, "old"))
    said = str(raised.value)
    assert "\n" not in said and "old.json" in said
    assert "missing selection" in said and "unknown renamed_key" in said


def test_a_writer_cannot_state_a_number_in_both_files(tmp_path):
    """The metrics file holds numbers only; a score that is not one stops the write."""
    kind, path = next((k, p) for k, p in COMMITTED if k is SentimentRunFile)
    run = replace(read_run(kind, path), accuracy="0.8")
    with pytest.raises(ValueError, match="is not a number"):
        write_run(run, tmp_path, "bad")
    assert not list(tmp_path.iterdir())
