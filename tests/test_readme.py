"""The README: one screen or two, its generated blocks (`minbert readme`: ours beside the
paper's, and the model worth trying) as the committed metrics give them, and the command
that rewrites them."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from conftest import REPO
from typer.testing import CliRunner

from minbert.cli import app
from minbert.tools.readme import STAGE_TIMES, begin, end, strongest, update

PERFORMANCE = Path("docs") / "performance.md"

README_LIMIT = 12 * 1024  # bytes; the rest lives under docs/


def test_the_readme_fits_a_screen_or_two():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes, more than {README_LIMIT}: move detail to docs/"


def test_the_readme_blocks_are_what_the_committed_metrics_give():
    assert update(REPO, check=True) == [], "generated blocks differ from the results: run `minbert readme`"


def test_the_readme_examples_use_the_model_the_block_names():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## Use the trained model")
    section = text[start : text.index("\n## ", start)]
    assert set(re.findall(r"models/multitask/([\w-]+)", section)) == {strongest(REPO / "metrics")}


def _copy(tmp_path):
    """The README, docs/performance.md, docs/parameters.md and what their blocks are made
    from (the GPU study's runs too), in a directory of their own."""
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    for path in (PERFORMANCE, STAGE_TIMES, Path("docs") / "parameters.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    (tmp_path / "reference").mkdir()
    shutil.copy(REPO / "reference" / "paper.yaml", tmp_path / "reference" / "paper.yaml")
    for folder in ("multitask", "sentiment", "gpu/metrics/multitask", "gpu/metrics/sentiment"):
        (tmp_path / "metrics" / folder).mkdir(parents=True)
        for path in (REPO / "metrics" / folder).glob("*.json"):
            shutil.copy(path, tmp_path / "metrics" / folder / path.name)
    for path in [*(REPO / "metrics").glob("zero-shot*.json"), REPO / "metrics" / "seed-study.json"]:
        shutil.copy(path, tmp_path / "metrics" / path.name)
    # The GPU study's provenance and the code its rows ran with, which marks them stale.
    shutil.copy(
        REPO / "metrics" / "gpu" / "provenance.json", tmp_path / "metrics" / "gpu" / "provenance.json"
    )
    for folder in ("src", "stages"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _readme(*args: str):
    return CliRunner().invoke(app, ["readme", *args], env={"COLUMNS": "200"})


def _block(text: str, name: str, source: str = "metrics/") -> str:
    return text[text.index(begin(name, source)) : text.index(end(name))]


def test_readme_rewrites_the_model_block_when_another_configuration_ranks_first(tmp_path):
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
    block = _block(after, "model")
    assert "**`baseline`**, 0.990" in " ".join(block.split()) and "| `baseline` |" in block
    # Beside the checkpoint over the seeds both ran with, as the report's findings say it.
    assert "over the seeds both ran with" in " ".join(block.split())
    assert "models/multitask/baseline --task" in block  # the examples follow the model
    # Only the model block changed.
    assert after[: after.index(begin("model"))] == before[: before.index(begin("model"))]
    assert after[after.index(end("model")) :] == before[before.index(end("model")) :]
    assert _readme("--check", "--repo", str(repo)).exit_code == 0


def test_readme_rewrites_the_results_block_from_the_metrics_and_the_paper(tmp_path):
    repo = _copy(tmp_path)
    before = (repo / "README.md").read_text(encoding="utf-8")
    block = _block(before, "results", "metrics/ and src/")
    best = json.loads((REPO / "metrics" / "multitask" / "best.json").read_text())
    assert (
        f"| `best`, ours (seed 11711) | {best['sst']:.3f} | {best['quora']:.3f} | {best['sts']:.3f} |"
        in block
    )
    assert "| `best`, the paper | 0.542 | 0.878 | 0.877 | 0.766 |" in block  # reference/paper.yaml
    assert "[report/README.md](report/README.md)" in block
    # A rerun of `best` and of SST's full fine-tuning: only the results block changes.
    path = repo / "metrics" / "multitask" / "best.json"
    path.write_text(json.dumps({**best, "sts": 0.8123}))
    sst = repo / "metrics" / "sentiment" / "sst-full.json"
    sst.write_text(json.dumps({**json.loads(sst.read_text()), "accuracy": 0.5011}))
    assert _readme("--check", "--repo", str(repo)).exit_code == 1
    assert _readme("--repo", str(repo)).exit_code == 0
    after = (repo / "README.md").read_text(encoding="utf-8")
    block = _block(after, "results", "metrics/ and src/")
    assert f"| `best`, ours (seed 11711) | {best['sst']:.3f} | {best['quora']:.3f} | 0.812 |" in block
    assert re.search(r"\| ours \| [\d.]+ \| 0\.501 \|", block), block
    results = begin("results", "metrics/ and src/")
    assert after[: after.index(results)] == before[: before.index(results)]
    assert after[after.index(end("results")) :] == before[before.index(end("results")) :]


def test_a_readme_without_the_blocks_is_refused_in_one_line(tmp_path):
    repo = _copy(tmp_path)
    (repo / "README.md").write_text("# minbert\n", encoding="utf-8")
    result = _readme("--repo", str(repo))
    assert result.exit_code == 1 and "no generated block" in result.output, result.output
    assert "Traceback" not in result.output


def test_the_stage_times_follow_the_last_measured_repro(tmp_path):
    repo = _copy(tmp_path)
    measured = json.loads((repo / STAGE_TIMES).read_text())
    before = (repo / PERFORMANCE).read_text(encoding="utf-8")
    block = _block(before, "stage-times", STAGE_TIMES.as_posix())
    total = measured["results"]["wall_s"] / 60
    command = " ".join(measured["results"]["command"])
    assert f"| **`{command}`, in all** | **{total:.1f}** |" in block
    # MLM runs as `minbert mlm-study`, outside the default pipeline the table times.
    assert "| `multitask best` |" in block and "models/mlm" not in block
    # A rerun where `report` took 10 minutes while other work used 1.2 cores: only that row,
    # the total and the sentence on other work change, and only docs/performance.md is rewritten.
    (report,) = [s for s in measured["results"]["stages"] if s["stage"].startswith("report ")]
    report["seconds"] = 600
    measured["results"]["wall_s"] += 300
    measured["results"]["other_work_cores"] = 1.2
    (repo / STAGE_TIMES).write_text(json.dumps(measured))
    readme = (repo / "README.md").read_text(encoding="utf-8")
    stale = _readme("--check", "--repo", str(repo))
    assert stale.exit_code == 1 and "performance.md" in stale.output and "README" not in stale.output
    assert _readme("--repo", str(repo)).exit_code == 0
    block = _block((repo / PERFORMANCE).read_text(encoding="utf-8"), "stage-times", STAGE_TIMES.as_posix())
    assert "| `report` | 10.0 |" in block and f"**{total + 5:.1f}**" in block
    assert "other work during the run: 1.20 cores on average, so the minutes are not" in " ".join(
        block.split()
    )
    assert (repo / "README.md").read_text(encoding="utf-8") == readme
    # Alone on the machine: said so; a record from before the measurement: the start's load only.

    def regenerated(measured: dict) -> str:
        (repo / STAGE_TIMES).write_text(json.dumps(measured))
        assert _readme("--repo", str(repo)).exit_code == 0
        text = (repo / PERFORMANCE).read_text(encoding="utf-8")
        return " ".join(_block(text, "stage-times", STAGE_TIMES.as_posix()).split())

    measured["results"]["other_work_cores"] = 0.02
    assert "0.02 cores on average, so the minutes are its own" in regenerated(measured)
    # The machine's own speed, probed before and after the command, is said when recorded.
    measured["results"]["matmul_gflop_s"] = {"size": 2048, "before": 251.4, "after": 262.6}
    assert "ran at 251 GFLOP/s just before and 263 just after" in regenerated(measured)
    del measured["results"]["matmul_gflop_s"]
    assert "GFLOP/s" not in regenerated(measured)
    del measured["results"]["other_work_cores"]
    measured["load_average_at_start"][0] = 2.5
    block = regenerated(measured)
    assert "load average 2.50 at the start; other work during the run not measured" in block


def test_the_parameter_table_follows_the_declarations(tmp_path):
    """docs/parameters.md lists every parameter the schema places, with what its declared
    setting accepts; a stale table is found."""
    from minbert.pipeline.schema import described

    repo = _copy(tmp_path)
    table = (repo / "docs" / "parameters.md").read_text()
    for key, accepts, meaning in described():
        assert f"| `{key}` | {accepts} | {meaning} |" in table
    row = "| `scales.<name>.multitask.epochs` | an integer >= 1 |"
    assert row in table
    stale = table.replace(row, row.replace("an integer >= 1", "a count"))
    (repo / "docs" / "parameters.md").write_text(stale)
    stale = _readme("--check", "--repo", str(repo))
    assert stale.exit_code == 1 and "parameters.md" in stale.output


def test_a_gpu_row_is_marked_stale_when_the_code_it_ran_with_changes(tmp_path):
    repo = _copy(tmp_path)
    provenance_file = repo / "metrics" / "gpu" / "provenance.json"
    provenance = json.loads(provenance_file.read_text())
    stage = provenance["stages"]["multitask@baseline"]
    # As if every file it ran with were this checkout's: current, then one changed.
    for name in [n for n in stage["fingerprint"] if n.startswith(("src/", "stages/"))]:
        path = repo / name
        stage["fingerprint"][name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "x"
    provenance_file.write_text(json.dumps(provenance))
    assert _readme("--repo", str(repo)).exit_code == 0
    block = _block((repo / "README.md").read_text(encoding="utf-8"), "results", "metrics/ and src/")
    commit = provenance["calls"][stage["call"]]["commit"][:7]
    assert f"| `baseline`, ours on a GPU ({commit}) |" in block
    step = repo / "src" / "minbert" / "train" / "multitask_step.py"
    step.write_text(step.read_text() + "# changed\n")
    assert _readme("--check", "--repo", str(repo)).exit_code == 1
    assert _readme("--repo", str(repo)).exit_code == 0
    block = _block((repo / "README.md").read_text(encoding="utf-8"), "results", "metrics/ and src/")
    assert f"| `baseline`, ours on a GPU ({commit}, stale) |" in block
