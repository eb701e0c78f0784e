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


def test_the_untrained_checkpoints_settings_digest_holds_what_it_was_fitted_with_but_no_seed():
    """The seed study tells the checkpoint's rows fitted at other settings by this digest:
    its Quora pairs and its probe's warm-up change it, its seed does not."""
    from minbert.report.comparisons import settings_digest

    run = read_run(ZeroShotRunFile, REPO / "metrics" / "zero-shot.json")
    assert run.settings is not None and run.settings.sst_probe.seed == run.seed
    probe = run.settings.sst_probe
    other_seed = replace(
        run, seed=run.seed + 1, settings=replace(run.settings, sst_probe=replace(probe, seed=1))
    )
    assert settings_digest(other_seed) == settings_digest(run)
    fewer_pairs = replace(run, settings=replace(run.settings, quora_train_pairs=1000))
    warmup = replace(probe.head_warmup, epochs=probe.head_warmup.epochs + 1)
    other_warmup = replace(run, settings=replace(run.settings, sst_probe=replace(probe, head_warmup=warmup)))
    assert len({settings_digest(r) for r in (run, fewer_pairs, other_warmup)}) == 3


def test_a_runs_settings_digest_holds_how_many_batches_a_step_took():
    """A step of three batches is other settings than a step of one (the seed study refuses
    the one's seeds for the other); a run of one batch a step keeps the digest it had
    before its record could state it."""
    from minbert.report.comparisons import settings_digest

    run = read_run(MultitaskRunFile, REPO / "metrics" / "multitask" / "best-round-robin.json")
    assert run.batches_per_step is None
    assert "batches_per_step" not in json.loads(
        record_file(REPO / "metrics" / "multitask", "best-round-robin").read_text()
    )
    assert settings_digest(replace(run, batches_per_step=3)) != settings_digest(run)
    equal = read_run(MultitaskRunFile, REPO / "metrics" / "multitask" / "best-round-robin-equal.json")
    assert equal.batches_per_step == 3 and equal.batch_size == run.batch_size
