"""The real pipeline, through `dvc repro`, on a slice of the shared course data.

Copies the project's dvc.yaml, params.yaml, stages and sources into a fresh git
repository, points the data stage at the first rows of every course file and the
checkpoint at a tiny random BERT, and runs every stage end to end; then an
ablation with `dvc exp run -S optimizer=adamaxw`, compared by `dvc metrics diff`,
and MLM pretraining switched on with `dvc exp run -S 'mlm.pretrain=[continue]'`.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, tiny_multitask_scale, tiny_sentiment_scale

from minbert.pipeline.params import multitask_settings, resolve_all, validate
from minbert.pipeline.schema import lineage
from minbert.report.first_page import whole_report
from minbert.results import read_result

pytestmark = pytest.mark.slow  # the real pipeline through `dvc repro`

ROWS = 48


def _slice(src: Path, dst: Path, rows: int) -> None:
    """The header and first `rows` records of every course file, re-quoted properly."""
    dst.mkdir()
    for path in sorted(src.glob("*.csv")):
        with open(path, newline="", encoding="utf-8") as f:
            records = [r for _, r in zip(range(rows + 1), csv.reader(f, delimiter="\t"))]
        with open(dst / path.name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f, delimiter="\t", lineterminator="\n").writerows(records)


def tool_env() -> dict:
    """The environment for the project's tools (dvc, minbert): this Python's
    scripts first on PATH, whether or not the virtual environment is activated."""
    return dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        DVC_NO_ANALYTICS="1",
    )


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, env=tool_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def make_project(root: Path, shared_data: Path, checkpoint: Path, rows: int, edit) -> Path:
    """The project's pipeline in a fresh git + DVC repository at ``root``: its
    dvc.yaml, stages and sources, the first ``rows`` of every course file, the
    ``checkpoint``, and params.yaml as ``edit(params)`` leaves it."""
    for name in ("dvc.yaml", "params.yaml", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    for name in ("stages", "src", "reference"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    _slice(shared_data, root / "slice", rows)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params.update(checkpoint=str(checkpoint), device="cpu")
    params["data"].update(source=str(root / "slice"), verify_checksums=False, skip_ids={})
    edit(params)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run(["git", "init", "-q"], root)
    _run(["dvc", "init", "-q"], root)
    _run(["dvc", "config", "core.analytics", "false"], root)
    shutil.copytree(REPO / ".dvc" / "plots", root / ".dvc" / "plots")  # the plots' template
    (root / "bench" / "results").mkdir(parents=True)
    report_deps = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["report"]["deps"]
    for measured in (d for d in report_deps if d.startswith("bench/results/")):  # committed measurements
        shutil.copy(REPO / measured, root / measured)
    return root


def _tiny_scale(params: dict) -> None:
    params["mlm"]["pretrain"] = ["continue"]  # off in params.yaml (time), on here to be tested
    params["scales"]["cpu"].update(
        max_length={"sst": 64, "cfimdb": 64, "quora": 64, "sts": 64},
        mlm={"max_length": 32, "epochs": 1, "batch_size": 8, "sequences": 200},
    )
    tiny_sentiment_scale(
        params,
        batch_size=8,
        epochs={"last-layer": 2, "full": 1},
        train_examples={"sst": 0, "cfimdb": 0},
        max_tokens=256,
    )
    tiny_multitask_scale(
        params,
        epochs=2,
        batch_size={"sst": 8, "quora": 8, "sts": 8},
        history={"dev": 20, "train": 10},
        test_predictions=False,
    )


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, shared_data, tiny_checkpoint):
    root = make_project(tmp_path_factory.mktemp("pipeline"), shared_data, tiny_checkpoint, ROWS, _tiny_scale)
    _run(["dvc", "repro"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results"], root)
    # The configurations `dvc repro` leaves out, as docs/experiments.md runs them.
    _run(["minbert", "extra-runs"], root)
    _run(["dvc", "repro"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "extra runs"], root)
    return root


def test_repro_produces_every_output(pipeline):
    runs = ["sst-last-layer", "sst-full", "cfimdb-last-layer", "cfimdb-full"]
    for run in runs:
        metrics = read_result(pipeline / "metrics" / "sentiment" / f"{run}.json")
        assert 0 <= metrics["accuracy"] <= 1
        # All training rows but the 4 of the validation split that chooses the epoch.
        assert metrics["train_examples"] == ROWS - 4 and metrics["validation_examples"] == 4
        assert metrics["dev_examples"] == ROWS
        assert (pipeline / "predictions" / "sentiment" / run / "test-out.csv").is_file()
    manifest = json.loads((pipeline / "data" / "prepared" / "manifest.json").read_text())
    assert manifest["quora_split"]["kind"] == "carved-from-dev"
    assert not any(i["verified"] for i in manifest["inputs"])  # a slice is not the course file
    report = whole_report(pipeline / "report")
    assert "Table 1" in report and "sst-full" in report and "0.505" in report
    lock = yaml.safe_load((pipeline / "dvc.lock").read_text())
    assert {"prepare", "tokenize", "zero-shot", "report", "sentiment@sst-full"} <= set(lock["stages"])
    params = yaml.safe_load((pipeline / "params.yaml").read_text())
    configs, extra = params["configs"], json.loads((pipeline / "metrics" / "extra-runs.json").read_text())
    for config in configs:
        metrics = read_result(pipeline / "metrics" / "multitask" / f"{config}.json")
        assert metrics["data_split"]["quora"]["kind"] == "carved-from-dev"
        assert metrics["dev_examples"]["sst"] == ROWS  # the full dev set, not the history's slice
        # Settings travel through the resolve stage's file in their own order.
        assert list(metrics["batch_size"]) == ["sst", "quora", "sts"]
        made = lock["stages"] if config in params["repro_configs"] else extra["stages"]
        assert f"multitask@{config}" in made
        history = pd.read_csv(pipeline / "metrics" / "multitask" / f"{config}-history.csv")
        assert history.epoch.tolist() == [0, 1, 2]
    zero_shot = read_result(pipeline / "metrics" / "zero-shot.json")
    assert zero_shot["dev_examples"]["sts"] == ROWS and -1 <= zero_shot["sts"] <= 1
    for figure in ("figure2-loss.png", "figure3-average.png", "figure-conflicts.png"):
        assert (pipeline / "report" / figure).stat().st_size > 10_000
    # The report opens with its summary and tables, then its pages (setup and findings
    # first), and names every configuration.
    assert report.startswith("# minbert results\n") and report.index("## Summary") < report.index(
        "## Table 1"
    ) < report.index("## Setup at a glance") < report.index("## Findings")
    for config in configs:
        assert f"`{config}`" in report.split("## How each number was produced")[1]
    assert (pipeline / "models" / "multitask" / "best" / "README.md").is_file()  # the model card


def test_mlm_pretraining_runs_by_default_and_feeds_fine_tuning(pipeline):
    lock = yaml.safe_load((pipeline / "dvc.lock").read_text())
    assert {"mlm@continue", "multitask-mlm@continue-baseline"} <= set(lock["stages"])
    pretraining = read_result(pipeline / "metrics" / "mlm" / "continue.json")
    assert pretraining["after"]["masked_tokens"] == pretraining["before"]["masked_tokens"] > 0
    tuned = read_result(pipeline / "metrics" / "multitask-mlm" / "continue-baseline.json")
    assert tuned["pretraining"]["start"] == "continue"
    assert "MLM continue" in tuned["checkpoint"]["name"]
    assert (pipeline / "models" / "mlm" / "continue" / "model.safetensors").is_file()
    report = (pipeline / "report" / "mlm.md").read_text(encoding="utf-8")
    section = report[report.index("## MLM pretraining") :]
    rows = [line for line in section.splitlines() if line.startswith("| `baseline` |")]
    assert len(rows) == 2 and "MLM continue" in rows[1] and "MLM" not in rows[0]
    assert rows[0].endswith("| (parent) |") and "[" in rows[1].split("|")[-2]


# What each stage's metrics file holds (minbert.results): the numbers a user compares.
METRICS_KEYS = {
    "multitask": {"sst", "quora", "sts", "average", "epoch", "steps"},
    "multitask-mlm": {"sst", "quora", "sts", "average", "epoch", "steps"},
    "sentiment": {"accuracy", "epoch", "steps"},
    "mlm": {"accuracy", "steps"},
}


def test_status_is_clean_and_metrics_show_fits_a_terminal(pipeline):
    status = _run(["dvc", "status", "--json"], pipeline)
    assert json.loads(status) == {}
    shown = json.loads(_run(["dvc", "metrics", "show", "--json"], pipeline))
    files = next(iter(shown.values()))["data"]
    assert (
        len(files) == 1 + 4 + len(yaml.safe_load((pipeline / "params.yaml").read_text())["repro_configs"]) + 2
    )
    for path, content in files.items():
        folder = "zero-shot" if path == "metrics/zero-shot.json" else path.split("/")[1]
        keys = {"sst", "quora", "sts", "average"} if folder == "zero-shot" else METRICS_KEYS[folder]
        assert set(content["data"]) == keys, path
    # Every configuration's average, in a table no wider than a 120-column terminal.
    env = {**tool_env(), "COLUMNS": "120"}
    table = subprocess.run(
        ["dvc", "metrics", "show"], cwd=pipeline, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert max(map(len, table.splitlines())) <= 120, table
    header, *rows = table.splitlines()
    average = header.index("average")
    configs = yaml.safe_load((pipeline / "params.yaml").read_text())["repro_configs"]
    for config in configs:
        row = next(r for r in rows if r.startswith(f"metrics/multitask/{config}.json "))
        assert re.match(r"\d\.\d+", row[average:]), row


def test_killed_stage_resumes_under_dvc_repro_to_the_same_metrics(pipeline):
    """Kill `dvc repro` of a fine-tuning stage once it has saved an epoch; `dvc repro`
    then reruns the stage, which resumes and ends with an uninterrupted run's numbers."""
    state = pipeline / ".resume" / "multitask-best-adamw.pt"
    outputs = [
        pipeline / "metrics" / "multitask" / name
        for name in ("best-adamw.json", "best-adamw-history.csv", "best-adamw-conflicts.csv")
    ]
    env = tool_env()
    try:
        # A new value for this stage only (no configuration changes best-adamw), so that DVC
        # has no earlier result to restore.
        params = yaml.safe_load((pipeline / "params.yaml").read_text())
        params["configs"]["best-adamw"]["smart"] = {"mu": 0.5}
        (pipeline / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        # The stage reads its settings from the resolve stage's file: `resolve` reruns
        # first (its upstream is unchanged), then the fine-tuning.
        proc = subprocess.Popen(
            ["dvc", "repro", "multitask@best-adamw"],
            cwd=pipeline,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while not state.exists():
            assert proc.poll() is None, f"the stage ended before saving a state: {proc.stderr.read()}"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # dvc and the stage: a lost machine
        proc.wait()
        assert not outputs[0].exists()
        rerun = subprocess.run(
            ["dvc", "repro"], cwd=pipeline, env=env, capture_output=True, text=True, timeout=600
        )
        assert rerun.returncode == 0, rerun.stderr
        assert "Running stage 'multitask@best-adamw'" in rerun.stdout
        assert "resumed from .resume/multitask-best-adamw.pt after epoch 1" in rerun.stdout + rerun.stderr
        assert not state.exists()
        assert json.loads(_run(["dvc", "status", "--json"], pipeline)) == {}
        resumed = [path.read_bytes() for path in outputs]
        _run(["dvc", "repro", "--force", "--single-item", "multitask@best-adamw"], pipeline)
        assert [path.read_bytes() for path in outputs] == resumed
    finally:
        _run(["git", "checkout", "--", "."], pipeline)
        _run(["dvc", "checkout", "--force"], pipeline)
        state.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def experiment(pipeline, tmp_path_factory):
    """The README's workflow as a new user meets it: a fresh clone of the committed
    project (no DVC remote, so no cached output), `dvc repro`, then the ablation
    `dvc exp run -S optimizer=adamaxw`, once for the tests that read it: its results are
    left in the clone's workspace, and DVC keeps the experiment, which `dvc exp show`
    lists."""
    clone = tmp_path_factory.mktemp("clone") / "project"
    _run(["git", "clone", "-q", str(pipeline), str(clone)], clone.parent)
    _run(["dvc", "repro"], clone)
    assert _run(["git", "status", "--porcelain"], clone) == ""  # the committed results, rebuilt here
    _run(["dvc", "exp", "run", "-S", "optimizer=adamaxw"], clone)
    return clone


def test_experiment_changes_results_and_metrics_diff_shows_it(experiment):
    pipeline = experiment
    params = yaml.safe_load((pipeline / "params.yaml").read_text())
    assert params["optimizer"] == "adamaxw"
    diff = json.loads(_run(["dvc", "metrics", "diff", "--json"], pipeline))
    baseline = diff["metrics/multitask/baseline.json"]  # listed: some number of it changed
    assert any(v.get("diff") for v in baseline.values() if isinstance(v, dict)), baseline
    # A configuration that sets its own optimizer is untouched by the ablation.
    assert "metrics/multitask/best.json" not in diff or all(
        v.get("diff", 0) == 0 for v in diff["metrics/multitask/best.json"].values() if isinstance(v, dict)
    )
    text = _run(["dvc", "metrics", "diff"], pipeline)
    assert "metrics/multitask/baseline.json" in text and "average" in text


def test_after_the_experiment_every_view_says_what_ran(experiment):
    """The ablation workflow's other views: the report's row titles name the optimizer
    each run used; `dvc exp show --only-changed` shows the changed numbers in 200
    columns; `dvc plots diff HEAD` tells the revisions apart and draws the training loss
    as a curve within the one epoch's steps."""
    pipeline = experiment
    report = whole_report(pipeline / "report")
    titles = [line.split(" | ")[0] for line in report.splitlines() if "(`baseline`)" in line.split(" | ")[0]]
    assert titles and all("AdamaxW" in t and not re.search(r"\bAdamW\b", t) for t in titles), titles
    env = {**tool_env(), "COLUMNS": "200"}
    shown = subprocess.run(
        ["dvc", "exp", "show", "--no-pager", "--only-changed"],
        cwd=pipeline,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert re.search(r"metrics/multitask/baseline\.json:\w+", shown), shown
    assert len(re.findall(r"\d\.\d{3,}", shown)) >= 2, shown  # numbers, not "…"
    plots = json.loads(_run(["dvc", "plots", "diff", "HEAD", "--json"], pipeline))["data"]
    for name in ("dev-average", "sst-loss"):
        (render,) = plots[name]
        content = render["content"]
        assert content["encoding"]["strokeDash"]["field"] == "rev"
        values = content["data"]["values"]
        assert {v["rev"] for v in values} == {"HEAD", "workspace"}, name
    losses = [v for v in plots["sst-loss"][0]["content"]["data"]["values"] if v["config"] == "baseline"]
    # Here an epoch is 18 steps, one window of the loss log (its 2-step tail joins it):
    # a point per epoch; the cpu study's one epoch draws 27 (tests/test_report.py).
    steps = {v["step"] for v in losses if v["rev"] == "workspace"}
    assert plots["sst-loss"][0]["content"]["encoding"]["x"]["field"] == "step" and len(steps) == 2, steps


def test_no_layout_fits_every_average_into_dvc_exp_show_at_200_columns(tmp_path):
    """docs/experiments.md: DVC's own table cannot show every configuration's average in a
    200-column terminal, however the pipeline is laid out. The smallest layout, a scratch
    project whose only metrics file holds the configurations' averages under their names,
    with one parameter and one code dependency, shows some of them after an experiment
    and collapses the rest to "…": the names alone are wider than the terminal leaves."""
    configs = list(yaml.safe_load((REPO / "params.yaml").read_text())["configs"])
    (tmp_path / "params.yaml").write_text("optimizer: adamw\n")
    averages = json.dumps(dict.fromkeys(configs, 0.4567))
    (tmp_path / "summary.py").write_text(f"open('summary.json', 'w').write({averages!r})\n")
    stage = {"cmd": "python summary.py", "deps": ["summary.py"], "params": ["optimizer"]}
    stage["metrics"] = [{"summary.json": {"cache": False}}]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"summary": stage}}))
    for command in (
        ["git", "init", "-q"],
        ["dvc", "init", "-q"],
        ["dvc", "repro", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "summary"],
        ["dvc", "exp", "run", "-q", "-S", "optimizer=adamaxw"],
    ):
        _run(command, tmp_path)
    env = {**tool_env(), "COLUMNS": "200"}
    shown = subprocess.run(
        ["dvc", "exp", "show", "--no-pager"], cwd=tmp_path, env=env, capture_output=True, text=True
    ).stdout
    header = next(line for line in shown.splitlines() if "Experiment" in line).split()
    named = [c for c in configs if c in header]
    assert "…" in header and 0 < len(named) < len(configs), shown
    assert len(re.findall(r"0\.4567", shown)) >= 3 * len(named), shown  # numbers, not "…"


def test_compare_renders_every_configuration_within_a_terminal(experiment):
    """`minbert compare` (the README's ablation recipe; docs/experiments.md) after the experiment: a table
    per metric, every configuration's average for each experiment, 120 columns. (Without
    the experiment, run alone, it had only the baseline's column to show.)"""
    pipeline = experiment
    env = {**tool_env(), "COLUMNS": "120"}
    done = subprocess.run(["minbert", "compare"], cwd=pipeline, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= 120, done.stdout
    average = done.stdout[done.stdout.index("Average") :]
    for config in yaml.safe_load((pipeline / "params.yaml").read_text())["repro_configs"]:
        row = next(line for line in average.splitlines() if f"multitask/{config} " in line)
        assert len(re.findall(r"\d\.\d{4}", row)) >= 2, row  # the baseline and the experiment
    # A changed configuration's difference, with its paired interval from the dev predictions.
    assert re.search(r"\d\.\d{4} [+-]\d\.\d{3} \[[+-]\d\.\d{3,}, [+-]\d\.\d{3,}\]", average), average
    assert "optimizer=adamaxw" in done.stdout  # what the experiment changed


def _status(pipeline: Path) -> dict:
    return json.loads(_run(["dvc", "status", "--json"], pipeline))


@pytest.mark.parametrize(
    "setting, message",
    [
        ("+optimzer=adamaxw", "error: params.yaml: unknown key 'optimzer'"),
        ("optimizer=sgd", "error: params.yaml: optimizer = 'sgd' is not one of"),
    ],
)
def test_a_typo_or_a_rejected_value_stops_the_experiment_and_keeps_the_results(pipeline, setting, message):
    """`resolve` tracks the whole params.yaml: an unknown key (DVC's own suggestion for a
    typo is `-S +key=value`) reruns it and fails with the check's error. Its outputs
    persist, so nothing downstream goes stale: only params.yaml, as DVC left it, differs."""
    _run(["git", "checkout", "--", "."], pipeline)  # the committed results, whatever ran before
    _run(["dvc", "checkout", "--force"], pipeline)
    assert _status(pipeline) == {}
    settings = {p: p.read_bytes() for p in sorted((pipeline / "data" / "settings").rglob("*.json"))}
    try:
        done = subprocess.run(
            ["dvc", "exp", "run", "-S", setting], cwd=pipeline, env=tool_env(), capture_output=True, text=True
        )
        assert done.returncode != 0 and message in done.stdout + done.stderr, done.stdout + done.stderr
        assert {p: p.read_bytes() for p in settings} == settings
        assert set(_status(pipeline)) == {"resolve"}  # its params changed; every output is in place
        _run(["git", "checkout", "--", "params.yaml"], pipeline)
        assert _status(pipeline) == {}
    finally:
        _run(["git", "checkout", "--", "."], pipeline)


def test_plots_overlay_the_configurations_and_none_is_empty(pipeline):
    plots = json.loads(_run(["dvc", "plots", "show", "--json"], pipeline))["data"]
    configs = set(yaml.safe_load((pipeline / "params.yaml").read_text())["configs"])
    params = yaml.safe_load((pipeline / "params.yaml").read_text())
    pcgrad = {c for c in configs if multitask_settings(params, c).gradient == "pcgrad"}
    assert {"dev-average", "sst-loss", "pcgrad-conflicts"} <= set(plots)
    for name, renders in plots.items():
        (render,) = renders
        values = render["content"]["data"]["values"]
        assert values, name  # no empty plot
        y = render["content"]["encoding"]["y"]["field"]
        assert all(row[y] != "" for row in values), name  # an empty cell would be drawn as 0
        drawn = {row["config"] for row in values}
        assert drawn == (pcgrad if name == "pcgrad-conflicts" else configs), name
        assert render["content"]["encoding"]["color"]["field"] == "config"


def _stages_a_change_reaches(pipeline: Path, edit) -> set[str]:
    """The stages `dvc status` finds changed once `resolve` has written the settings
    that ``edit`` (a change to params.yaml) leads to; the project is restored after."""
    params = yaml.safe_load((pipeline / "params.yaml").read_text())
    edit(params)
    (pipeline / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        _run(["dvc", "repro", "--single-item", "resolve"], pipeline)
        return set(json.loads(_run(["dvc", "status", "--json"], pipeline)))
    finally:
        _run(["git", "checkout", "--", "."], pipeline)
        _run(["dvc", "checkout", "--force"], pipeline)


def test_a_parameter_change_reruns_only_the_stages_it_reaches(pipeline):
    params = yaml.safe_load((pipeline / "params.yaml").read_text())
    configs = params["configs"]
    # SMART's momentum: only the configurations with SMART.
    smart = {c for c in configs if multitask_settings(params, c).smart is not None}
    assert smart == {"best", "best-round-robin", "best-adamw", "best-summed", "best-round-robin-equal"}
    staged = set(params["repro_configs"])  # the others' runs are `minbert extra-runs`'s
    changed = _stages_a_change_reaches(pipeline, lambda p: p["smart"].update(beta=0.95))
    assert changed == {f"multitask@{c}" for c in smart & staged}
    # The default optimizer: only the configurations that keep the default and the
    # fine-tuning of `baseline` from the MLM checkpoint; not the zero-shot row, whose SST
    # probe reads a run's start alone (RunStart: of the optimizer, its weight decay, the
    # same for both here).
    keep_default = {c for c in configs if not any("optimizer" in configs[n] for n in lineage(configs, c))}
    changed = _stages_a_change_reaches(pipeline, lambda p: p.update(optimizer="adamaxw"))
    assert changed == {f"multitask@{c}" for c in keep_default & staged} | {"multitask-mlm@continue-baseline"}
    # A single-task parameter reaches the sentiment runs alone.
    changed = _stages_a_change_reaches(pipeline, lambda p: p["sentiment"].update(grad_clip=0.5))
    assert changed == {
        f"sentiment@{r}" for r in ("sst-last-layer", "sst-full", "cfimdb-last-layer", "cfimdb-full")
    }


@pytest.mark.parametrize(
    "setting, edit",
    [
        ("optimizer=adamaxw", lambda p: p.update(optimizer="adamaxw")),
        (
            "+configs.baseline.optimizer=adamaxw",
            lambda p: p["configs"]["baseline"].update(optimizer="adamaxw"),
        ),
    ],
)
def test_reach_lists_what_a_setting_reruns_before_it_runs(pipeline, setting, edit):
    """`minbert reach -S` (the README's ablation recipe): `resolve`, the stages `dvc status`
    finds changed once it has run with the setting, then the report downstream of them,
    in DVC's order; the project is left as it was."""
    _run(["git", "checkout", "--", "."], pipeline)  # the committed results, whatever ran before
    _run(["dvc", "checkout", "--force"], pipeline)
    out = _run(["minbert", "reach", "-S", setting], pipeline)
    assert _run(["git", "status", "--porcelain"], pipeline) == "" and _status(pipeline) == {}
    first, *lines = out.splitlines()
    listed = [line.split()[0] for line in lines]
    assert first.startswith(f"-S {setting}: {len(listed)} stages rerun"), out
    reached = _stages_a_change_reaches(pipeline, edit)
    assert "multitask-mlm@continue-baseline" in reached  # the one a newcomer does not expect
    assert "zero-shot" not in reached and "features" not in reached  # they read no optimizer
    assert listed[0] == "resolve" and listed[-1] == "report", out
    assert set(listed) == reached | {"resolve", "report"}, out


def test_the_paper_scale_resolves_and_plans(pipeline, tmp_path):
    """In a fresh clone, `dvc exp run --dry --force -S scale=paper` plans every stage, and
    the paper's settings pass the schema and resolve to the paper's values.

    `--force` is needed: DVC runs a dry experiment in a temporary copy of the repository
    without checking out any stage's outputs, so without it every stage downstream of
    the data stage fails on its missing inputs (DVC issue 10135), in a fresh clone as in
    a reproduced project. The next test shows that failure, so that this one is noticed
    when DVC fixes it."""
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(pipeline), str(clone)], tmp_path)
    out = _run(["dvc", "exp", "run", "--dry", "--force", "-S", "scale=paper"], clone)
    assert "ERROR" not in out
    stages = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]
    for stage in stages:
        assert f"Running stage '{stage}'" in out
    assert _run(["git", "status", "--porcelain"], clone) == ""  # a dry run changes nothing
    params = yaml.safe_load((pipeline / "params.yaml").read_text())
    params["scale"] = "paper"
    resolved = resolve_all(validate(params), {"quora_split": {"kind": "official"}})
    best = resolved["multitask/best.json"]["settings"]
    assert best["batch_size"] == {"sst": 2, "quora": 36, "sts": 2} and best["lr"] == 1e-4
    assert resolved["sentiment/sst-full.json"]["settings"]["batch_size"] == 64


def test_a_plain_dry_experiment_still_fails_on_missing_inputs(pipeline, tmp_path):
    """The DVC limitation the test above works around: without `--force`, the dry run
    stops at the first stage whose inputs are another stage's outputs."""
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(pipeline), str(clone)], tmp_path)
    done = subprocess.run(
        ["dvc", "exp", "run", "--dry", "-S", "scale=paper"],
        cwd=clone,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0 and "data/prepared" in done.stdout + done.stderr
