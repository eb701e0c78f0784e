"""The README's generated block (`minbert readme`): the model worth trying, as the
committed metrics give it, and the command that rewrites it."""

from __future__ import annotations

import json
import re
import shutil

from conftest import REPO
from typer.testing import CliRunner

from minbert.cli import app
from minbert.pipeline.readme import BEGIN, END, strongest, update


def test_the_readme_block_is_what_the_committed_metrics_give():
    assert update(REPO, check=True), "README.md's generated block differs from metrics/: run `minbert readme`"


def test_the_readme_examples_use_the_model_the_block_names():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## Use the trained model")
    section = text[start : text.index("\n## ", start)]
    assert set(re.findall(r"models/multitask/([\w-]+)", section)) == {strongest(REPO / "metrics")}


def _copy(tmp_path):
    """The README and the metrics the block is made from, in a directory of their own."""
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    (tmp_path / "metrics" / "multitask").mkdir(parents=True)
    for path in (REPO / "metrics").glob("zero-shot*.json"):
        shutil.copy(path, tmp_path / "metrics" / path.name)
    for path in (REPO / "metrics" / "multitask").glob("*.json"):
        shutil.copy(path, tmp_path / "metrics" / "multitask" / path.name)
    return tmp_path


def _readme(*args: str):
    return CliRunner().invoke(app, ["readme", *args], env={"COLUMNS": "200"})


def test_readme_rewrites_the_block_when_another_configuration_ranks_first(tmp_path):
    repo = _copy(tmp_path)
    assert _readme("--check", "--repo", str(repo)).exit_code == 0
    before = (repo / "README.md").read_text(encoding="utf-8")
    # `baseline` now first on the chance-corrected score (its record's dev_selection).
    record = repo / "metrics" / "multitask" / "baseline-run.json"
    content = json.loads(record.read_text())
    content["dev_selection"]["selection"] = 0.99
    record.write_text(json.dumps(content))
    stale = _readme("--check", "--repo", str(repo))
    assert stale.exit_code == 1 and "run `minbert readme`" in stale.output, stale.output
    assert (repo / "README.md").read_text(encoding="utf-8") == before  # --check writes nothing
    assert _readme("--repo", str(repo)).exit_code == 0
    after = (repo / "README.md").read_text(encoding="utf-8")
    block = after[after.index(BEGIN) : after.index(END)]
    assert "**`baseline`**, 0.990" in block and "| `baseline` |" in block
    # Only the block changed.
    assert after[: after.index(BEGIN)] == before[: before.index(BEGIN)]
    assert after[after.index(END) :] == before[before.index(END) :]
    assert _readme("--check", "--repo", str(repo)).exit_code == 0


def test_a_readme_without_the_block_is_refused_in_one_line(tmp_path):
    repo = _copy(tmp_path)
    (repo / "README.md").write_text("# minbert\n", encoding="utf-8")
    result = _readme("--repo", str(repo))
    assert result.exit_code == 1 and "no generated block" in result.output, result.output
    assert "Traceback" not in result.output
