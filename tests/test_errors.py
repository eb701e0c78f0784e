"""One error path: a damaged file of every kind the pipeline reads ends a command or a
stage with one line, ``error: <file>: <reason>`` (the traceback with --debug)."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_cli import model_dir, runner  # noqa: F401  (model_dir: a fixture)

from minbert.cli import app
from minbert.data.batches import TokenizedTable
from minbert.errors import report_errors
from minbert.report.evidence import Evidence
from minbert.train.resume import ResumePoint


def _damaged(path):
    """``path`` cut to its first few bytes: a disk that filled up, a copy interrupted."""
    path.write_bytes(path.read_bytes()[:40])
    return path


def _one_line(result, path):
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [result.output.strip()], result.output
    assert result.output.startswith(f"error: {path}: "), result.output


def test_a_damaged_checkpoint(tmp_path, tiny_checkpoint):
    directory = shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint")
    weights = _damaged(directory / "model.safetensors")
    result = runner.invoke(app, ["checkpoint", str(directory)])
    _one_line(result, weights)
    assert "not a readable safetensors file" in result.output


def test_a_damaged_model_directory(tmp_path, model_dir):  # noqa: F811
    directory = shutil.copytree(model_dir, tmp_path / "model")
    for name in ("heads.safetensors", "model.safetensors"):
        damaged = _damaged(directory / name)
        _one_line(runner.invoke(app, ["predict", str(directory), "--task", "sst", "--text", "x"]), damaged)
        shutil.copyfile(model_dir / name, damaged)


def test_a_damaged_parquet_table(tmp_path, model_dir):  # noqa: F811
    table = tmp_path / "quora-dev.parquet"
    table.write_bytes(b"PAR1" + b"\0" * 64)
    _one_line(runner.invoke(app, ["evaluate", str(model_dir), "--task", "quora", str(table)]), table)
    # The stages' readers: a tokenised table, a prepared dev table (the report's labels).
    for read in (TokenizedTable.read, lambda path: Evidence(tmp_path, path.parent).labels("quora")):
        with pytest.raises(ValueError, match=f"^{table}: not a readable Parquet table"):
            read(table)


def test_a_damaged_resume_state(tmp_path, capsys):
    point = ResumePoint(tmp_path, "sentiment-sst-full", "key")
    point.save({"epoch": 1, "weights": torch.ones(2)})
    _damaged(point.path)
    with pytest.raises(SystemExit), report_errors(debug=False):  # as a stage reports it
        point.load()
    err = capsys.readouterr().err
    assert err.startswith(f"error: {point.path}: not a readable resume state") and err.count("\n") == 1


def test_an_interrupted_stage_ends_in_one_line_saying_what_was_kept(capsys, monkeypatch):
    from minbert.errors import reported

    monkeypatch.delenv("MINBERT_DEBUG", raising=False)

    @reported
    def stage():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ended:
        stage()
    assert ended.value.code == 130
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("interrupted:") and ".resume/" in said[0]
    assert "dvc repro" in said[0]


def test_progress_logs_plain_lines_where_stderr_is_not_a_terminal(monkeypatch):
    """A log file or CI sees a line every few seconds, not nothing until the end."""
    from rich.console import Console

    from minbert import progress as progress_module

    console = Console(record=True, width=120, force_terminal=False)
    monkeypatch.setattr(progress_module, "console", console)
    monkeypatch.setattr(progress_module, "LINE_INTERVAL", 0.0)
    with progress_module.progress() as bar:
        job = bar.add_task("epoch", total=3, status="")
        for step in range(3):
            bar.update(job, advance=1, status=f"loss {step}")
    lines = [line for line in console.export_text().splitlines() if "epoch: " in line]
    assert len(lines) == 3 and "epoch: 3/3" in lines[-1] and "loss 2" in lines[-1]
    # Quiet (ranks other than 0): nothing at all.
    monkeypatch.setattr(progress_module, "console", Console(record=True, force_terminal=False))
    with progress_module.progress(quiet=True) as bar:
        bar.update(bar.add_task("epoch", total=1, status=""), advance=1)
    assert "epoch: " not in progress_module.console.export_text()
