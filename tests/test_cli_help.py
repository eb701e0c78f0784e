"""Every command's --help, rendered at 80 and 120 columns, reads cleanly: no line
broken where the next word would have fitted, no `<bool>` beside a flag, no usage line
reading `{model}`, nothing wider than the terminal."""

import pytest
import typer
from typer.testing import CliRunner

from minbert.cli import app

runner = CliRunner()
COMMANDS = [None, *typer.main.get_command(app).commands]


def early_breaks(lines: list[str], columns: int) -> list[str]:
    """Lines that end although the next line's first word would have fitted after them:
    in prose (a line broken in the source) and in a panel's cell, where a continued
    cell's lines start furthest right of the panel's."""
    found = []
    panel = [i for i, line in enumerate(lines) if line.startswith("│")]
    indent = {i: len(lines[i]) - len(lines[i][1:].lstrip()) for i in panel}
    for i, (line, after) in enumerate(zip(lines, lines[1:])):
        if not line.strip() or not after.strip():
            continue
        if i in indent and i + 1 in indent:
            block = [indent[j] for j in panel if abs(j - i) < 40]
            word, free = after.split()[1], len(line) - len(line[:-1].rstrip())
            continued = indent[i + 1] == max(block) >= min(block) + 8  # rows start at 2 to 7
            if continued and not word.startswith("[") and free > len(word) + 3:
                found.append(f"{line[1:-1].strip()} / {after[1:-1].strip()}")
        elif line[0] == after[0] == " " and len(line.rstrip()) + 1 + len(after.split()[0]) < columns:
            found.append(f"{line.strip()} / {after.strip()}")
    return found


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "minbert")
def test_help_reads_cleanly_at_80_and_120_columns(command, columns):
    args = [command, "--help"] if command else ["--help"]
    result = runner.invoke(app, args, env={"COLUMNS": str(columns)}, prog_name="minbert")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= columns, result.output
    assert "<bool>" not in result.output and "<list[" not in result.output, result.output
    usage = next(line for line in lines if "Usage:" in line)
    assert "{" not in usage and f"minbert {command or ''}".strip() in usage, usage
    assert not early_breaks(lines, columns), early_breaks(lines, columns)


def test_the_checker_finds_a_sentence_broken_mid_line():
    prose = [
        " FILE may be a course file (its known-bad rows, left",
        " out), a",
        " CSV/TSV with named columns.",
    ]
    assert "out), a / CSV/TSV with named columns." in early_breaks(prose, 80)
    panel = [
        "│ predict    Predict with a model: a file (to --out,                 │",
        "│            in the course's                                         │",
        "│            submission format).                                     │",
    ]
    assert len(early_breaks(panel, 70)) == 2  # "in" fitted after "--out,", "submission" after "course's"
    wrapped = [
        "│ predict    Predict with a model: a file (to --out, in the course's │",
        "│            submission format).                                     │",
    ]
    assert early_breaks(wrapped, 70) == []
