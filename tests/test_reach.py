"""`minbert reach` on the project's own dvc.yaml, dvc.lock and params.yaml: what a `-S`
reaches, before it runs, with nothing in the project changed. (On a reproduced
project, against `dvc status`: tests/test_pipeline.py.)"""

from __future__ import annotations

import shlex

import pytest
import yaml
from conftest import REPO
from typer.testing import CliRunner

from minbert.cli import app
from minbert.pipeline.params import multitask_settings

pytestmark = pytest.mark.slow  # DVC reads the project's pipeline on a scratch copy


def _reach(*settings: str):
    args = [a for s in settings for a in ("-S", s)]
    return CliRunner().invoke(app, ["reach", "--repo", str(REPO), *args], env={"COLUMNS": "200"})


def test_reach_lists_the_configurations_a_setting_reaches_and_changes_nothing():
    before = {name: (REPO / name).read_bytes() for name in ("params.yaml", "dvc.lock")}
    result = _reach("smart.beta=0.95")
    assert result.exit_code == 0, result.output
    first, *lines = result.stdout.splitlines()
    stages = [line.split()[0] for line in lines]
    assert first == f"-S smart.beta=0.95: {len(stages)} stages rerun (against dvc.lock)"
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    smart = {c for c in params["repro_configs"] if multitask_settings(params, c).smart is not None}
    assert smart and set(stages) == {"resolve", "report"} | {f"multitask@{c}" for c in smart}
    assert stages[0] == "resolve" and stages[-1] == "report"
    assert lines[0].split(None, 1)[1] == "params.yaml: smart"
    assert lines[1].split(None, 1)[1].startswith("data/settings/multitask/")
    assert {name: (REPO / name).read_bytes() for name in before} == before


def test_the_default_optimizer_reaches_only_the_runs_that_use_it():
    # The zero-shot row's SST probe reads the run's start alone (RunStart), not the
    # optimizer: it is not rerun; nor are the configurations that set their own.
    result = _reach("optimizer=adamaxw")
    assert result.exit_code == 0, result.output
    stages = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    changed = {**params, "optimizer": "adamaxw"}
    default = {
        c for c in params["repro_configs"] if multitask_settings(params, c) != multitask_settings(changed, c)
    }
    assert default and "best" not in default
    assert set(stages) == {"resolve", "report"} | {f"multitask@{c}" for c in default}, result.stdout
    assert "zero-shot" not in stages and "features" not in stages


def test_reach_refuses_a_rejected_value_or_an_unknown_key_in_one_line():
    for setting, said in (
        ("optimizer=sgd", "error: params.yaml with optimizer=sgd: optimizer = 'sgd' is not one of"),
        ("optimzer=adamaxw", "error: params.yaml with optimzer=adamaxw: Could not override 'optimzer'."),
    ):
        result = _reach(setting)
        assert result.exit_code == 1 and said in result.output, result.output
        assert "Traceback" not in result.output


def test_the_readme_shows_what_reach_prints():
    """The README's ablation recipe, its `minbert reach` example as the command prints it."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("$ minbert reach ")
    command, *shown = text[start : text.index("```", start)].strip().splitlines()
    settings = shlex.split(command)[4::2]  # $ minbert reach -S A -S B
    result = _reach(*settings)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == shown
