"""`minbert compare` on a small DVC project of its own: each experiment's difference from
its parent with a paired interval from the predictions, and why the workspace differs."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap

import numpy as np
import pandas as pd
import pytest
import yaml
from test_pipeline import _run, tool_env
from typer.testing import CliRunner

from minbert.cli import app
from minbert.data.predictions import read_predictions
from minbert.metrics import paired

pytestmark = pytest.mark.slow  # a DVC project of its own, reproduced and experimented on

# A stage per configuration: dev predictions that are the labels, wrong for a share
# `noise` of the examples, for the first N more (extra/<config>.txt), and for the first
# $JITTER (another machine's arithmetic: the same inputs, other numbers).
STAGE = """
import os, sys
from pathlib import Path
import numpy as np, pandas as pd, yaml
from minbert.data.predictions import write_predictions
from minbert.metrics import fixed, score
config = sys.argv[1]
noise = yaml.safe_load(open("params.yaml"))["configs"][config]["noise"]
wrong_first = int(Path(f"extra/{config}.txt").read_text()) + int(os.environ.get("JITTER", "0"))
rng = np.random.default_rng(0)
numbers = {}
for task in ("sst", "quora", "sts"):
    table = pd.read_parquet(f"data/prepared/{task}-dev.parquet")
    labels = table["label"].to_numpy(float)
    wrong = rng.random(len(labels)) < noise
    wrong[:wrong_first] = True
    if task == "sts":
        predictions = np.round(np.where(wrong, 5 - labels, labels), 3)
    else:
        predictions = np.where(wrong, (labels + 1) % (5 if task == "sst" else 2), labels)
    out = Path(f"predictions/multitask/{config}/{task}-dev-out.csv")
    write_predictions(out, task, table["id"], predictions)
    numbers[task] = fixed(score(task, labels, predictions))
numbers["average"] = fixed(np.mean(list(numbers.values())))
Path("metrics/multitask").mkdir(parents=True, exist_ok=True)
Path(f"metrics/multitask/{config}.json").write_text(__import__("json").dumps(numbers))
"""

DVC_YAML = """
stages:
  train:
    foreach: ${configs}
    do:
      cmd: python make.py ${key}
      deps:
        - make.py
        - data/prepared
        - extra/${key}.txt
      params:
        - configs.${key}
      outs:
        - predictions/multitask/${key}
      metrics:
        - metrics/multitask/${key}.json:
            cache: false
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A baseline commit of four configurations; an experiment that makes `a` better;
    then, in the workspace, `b` rebuilt with other numbers from the same inputs, `c`
    rerun on a changed input and `d`'s metrics file edited."""
    root = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(1)
    (root / "data" / "prepared").mkdir(parents=True)
    for task, labels in (
        ("sst", rng.integers(0, 5, 80)),
        ("quora", rng.integers(0, 2, 80)),
        ("sts", np.round(rng.uniform(0, 5, 80), 1)),
    ):
        table = pd.DataFrame({"id": [f"{task}{i}" for i in range(80)], "label": labels})
        if task == "quora":
            table["group"] = np.arange(80) // 2  # pairs that share a question
        table.to_parquet(root / "data" / "prepared" / f"{task}-dev.parquet")
    (root / "extra").mkdir()
    for config in "abcd":
        (root / "extra" / f"{config}.txt").write_text("0")
    (root / "make.py").write_text(textwrap.dedent(STAGE))
    (root / "dvc.yaml").write_text(DVC_YAML)
    configs = {c: {"noise": 0.5} for c in "abcd"}
    (root / "params.yaml").write_text(yaml.safe_dump({"configs": configs}))
    for command in (
        ["git", "init", "-q"],
        ["dvc", "init", "-q"],
        ["dvc", "repro", "-q"],
        ["git", "add", "-A"],
    ):
        _run(command, root)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "baseline"], root)
    shutil.copytree(root / "predictions", root.parent / "baseline-predictions")
    _run(["dvc", "exp", "run", "-q", "-n", "better-a", "-S", "configs.a.noise=0.05"], root)
    done = subprocess.run(
        ["dvc", "repro", "-q", "--force", "--single-item", "train@b"],
        cwd=root,
        env={**tool_env(), "JITTER": "1"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    (root / "extra" / "c.txt").write_text("20")
    _run(["dvc", "repro", "-q"], root)
    metrics = root / "metrics" / "multitask" / "d.json"  # edited by hand
    metrics.write_text(metrics.read_text().replace('"sst": 0.', '"sst": 0.1'))
    return root


def test_compare_shows_differences_with_paired_intervals_and_their_reasons(project):
    result = CliRunner().invoke(app, ["compare", "--repo", str(project)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = result.stdout  # the tables and notes; progress goes to stderr
    sst = text[text.index("SST acc") : text.index("Quora acc")]
    header = [c.strip() for c in next(line for line in sst.splitlines() if "workspace" in line).split("┃")]
    assert header[1:-1] == ["run", "master", "workspace (Δ from master)", "better-a (Δ from master)"]
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in sst.splitlines()
        if line.startswith("│")
    }
    a, b, c, d = (rows[f"multitask/{config}"] for config in "abcd")
    # `a` much better in the experiment and in the workspace (which holds its results):
    # the paired interval, from the predictions, excludes 0.
    ours = read_predictions(project / "predictions" / "multitask" / "a" / "sst-dev-out.csv")
    theirs = read_predictions(project.parent / "baseline-predictions" / "multitask" / "a" / "sst-dev-out.csv")
    labels = pd.read_parquet(project / "data" / "prepared" / "sst-dev.parquet")
    expected = paired(
        "sst",
        labels["label"].to_numpy(float),
        np.array([float(ours[i]) for i in labels["id"]]),
        np.array([float(theirs[i]) for i in labels["id"]]),
    )
    for column in (1, 2):  # the workspace, better-a
        assert a[column].endswith(f"{expected.value:+.3f} [{expected.low:+.3f}, {expected.high:+.3f}]"), a[
            column
        ]
    assert expected.low > 0 and re.fullmatch(r"\d\.\d{4}", a[0])  # the baseline: its value alone
    # `b` rebuilt from the same inputs, one answer changed: within its interval, marked.
    assert re.fullmatch(r"\d\.\d{4} -0\.01\d \[-0\.0\d\d, \+0\.000\] ~", b[1]), b[1]
    assert re.fullmatch(r"\d\.\d{4}", b[2]), b[2]  # unchanged in the experiment
    assert c[1].endswith("]") and not c[1].endswith("~")  # 20 more answers wrong: a clear loss
    assert re.fullmatch(r"0\.1\d{3} -0\.\d{3}", d[1]), d[1]  # no predictions that score it
    # What changed, experiment by experiment, and why the workspace differs otherwise.
    lines = " ".join(text.split())
    assert "better-a vs master: params changed: configs.a.noise=0.05" in lines
    assert "workspace vs master: params changed: configs.a.noise=0.05" in lines
    assert "same inputs, other numbers (rebuilt, e.g. on another CPU): multitask/b" in lines
    assert "changed inputs other than params: multitask/c (extra/c.txt)" in lines
    assert "other numbers than dvc.lock records (see `dvc status`): multitask/d" in lines
    assert "~: the interval includes 0" in lines


def test_compare_fits_the_terminal_and_keeps_the_parent(project):
    for columns in (80, 120):
        result = CliRunner().invoke(app, ["compare", "--repo", str(project)], env={"COLUMNS": str(columns)})
        assert result.exit_code == 0, result.output
        tables = result.stdout[: result.stdout.index("Each experiment's difference")]
        assert max(map(len, tables.splitlines())) <= columns, result.output
        assert "master" in tables and "workspace (Δ from master)" in tables  # the parent kept


def test_compare_in_a_fresh_clone_names_what_is_missing_and_shows_the_rest(project, tmp_path):
    # A clone without a DVC remote, rebuilt on "another CPU" (the same inputs, other
    # numbers, so other output hashes than the lock's): the baseline's predictions are in
    # no cache here. An experiment then changes `a`.
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(project), str(clone)], tmp_path)
    done = subprocess.run(
        ["dvc", "repro", "-q"], cwd=clone, env={**tool_env(), "JITTER": "1"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    _run(["dvc", "exp", "run", "-q", "-n", "clone-a", "-S", "configs.a.noise=0.05"], clone)
    result = CliRunner().invoke(app, ["compare", "--repo", str(clone)], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and result.exception is None, result.output
    text = " ".join(result.stdout.split())
    assert "clone-a (Δ from master)" in text  # the tables are there, differences without intervals
    assert "no interval for multitask/a in clone-a: master has no dev predictions" in text
    assert "missing: predictions/multitask/a/ at master: not in this clone's DVC cache" in text
    assert "`dvc push` them to a DVC remote and `dvc pull` here" in text
