"""The minbert command line."""

from typer.testing import CliRunner

from minbert.cli import app

runner = CliRunner()


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("validate", "check-params", "checkpoint", "sweep-report"):
        assert command in result.output


def test_validate_good_and_bad_files(tmp_path):
    good = _write(tmp_path / "good.csv", "\tid\tsentence\tsentiment\n0\ta1\t A fine film .\t3\n")
    result = runner.invoke(app, ["validate", str(good), "--task", "sst"])
    assert result.exit_code == 0, result.output

    bad = _write(tmp_path / "bad.csv",
                 "\tid\tsentence\tsentiment\n0\ta1\t A fine film .\t7\n1\ta2\t \t2\n2\ta1\tAgain .\t1\n")
    result = runner.invoke(app, ["validate", str(bad), "--task", "sst"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"{bad}:2: ") and "7" in lines[0]
    assert any(line.startswith(f"{bad}:3: ") for line in lines)
    assert any(line.startswith(f"{bad}:4: ") and "duplicate" in line for line in lines)


def test_validate_rejects_unknown_task(tmp_path):
    result = runner.invoke(app, ["validate", str(tmp_path / "x.csv"), "--task", "imdb"])
    assert result.exit_code == 2


def test_check_params(tmp_path):
    bad = _write(tmp_path / "params.yaml", "seed: 1\noptimiser: adamaxw\n")
    result = runner.invoke(app, ["check-params", str(bad)])
    assert result.exit_code == 1 and "unknown key 'optimiser'" in result.output
