"""Seed sweeps: aggregation into mean ± std, and a queued sweep through DVC."""

from __future__ import annotations

import json
import statistics
import subprocess
from dataclasses import replace

import pytest
import yaml
from conftest import REPO, tiny_multitask_scale, tiny_sentiment_scale
from test_pipeline import _run, make_project, tool_env

from minbert.cores import threads_each
from minbert.report.comparisons import settings_digest
from minbert.runs.training import MultitaskRunFile, SentimentRunFile, ZeroShotRunFile, read_run
from minbert.tools.sweep import UNTRAINED, Run, aggregate, beside, collect_runs, seed_study, study_entry

# Runs as a commit holds them: committed runs of the study with the numbers a test sets.
_MULTITASK = read_run(MultitaskRunFile, REPO / "metrics" / "multitask" / "baseline.json")
_SENTIMENT = read_run(SentimentRunFile, REPO / "metrics" / "sentiment" / "sst-full.json")


def multitask(seed=11711, sst=0.4, quora=0.7, sts=0.5, average=0.5) -> MultitaskRunFile:
    return replace(_MULTITASK, seed=seed, scores={"sst": sst, "quora": quora, "sts": sts, "average": average})


def _run_of(name, seed, optimizer, average, acc):
    return Run(
        name,
        {"seed": seed, "optimizer": optimizer, "smart": {"enabled": False}},
        {
            "multitask/baseline": multitask(seed, sst=acc, average=average),
            "sentiment/sst-full": replace(_SENTIMENT, seed=seed, accuracy=acc),
        },
    )


def test_aggregate_groups_by_everything_but_the_seed():
    runs = [
        _run_of("a", 1, "adamw", 0.50, 0.40),
        _run_of("b", 2, "adamw", 0.54, 0.44),
        _run_of("c", 3, "adamw", 0.58, 0.42),
        _run_of("d", 1, "adamaxw", 0.60, 0.30),
    ]
    text = aggregate(runs)
    assert "4 runs in 2 group(s)" in text
    sections = {part.split("\n", 1)[0]: part for part in text.split("## ")[1:]}
    adamw = sections["`optimizer=adamw`"]
    std = statistics.stdev([0.50, 0.54, 0.58])
    assert (
        f"| `multitask/baseline` | 0.420 ± {statistics.stdev([0.40, 0.44, 0.42]):.3f} | 0.700 ± 0.000 | "
        f"0.500 ± 0.000 | 0.540 ± {std:.3f} | 3 |" in adamw
    )
    assert "Seeds: 1, 2, 3 (runs: a, b, c)" in adamw
    adamaxw = sections["`optimizer=adamaxw`"]
    assert "| `sentiment/sst-full` | 0.300 | 1 |" in adamaxw  # one seed: no spread to show


def test_aggregate_needs_runs():
    with pytest.raises(ValueError, match="no runs to aggregate"):
        aggregate([])


def _one_config_one_run(params: dict) -> None:
    params["configs"] = {"baseline": {}}
    params["seed_study"]["configs"] = params["repro_configs"] = ["baseline"]
    params["seed_study"]["seeds"] = [1, 2]
    params["seed_study"]["jobs"] = 2  # side by side: each stage takes its share of the cores
    params["mlm"]["pretrain"] = []
    params["sentiment"]["runs"] = {"sst-last-layer": params["sentiment"]["runs"]["sst-last-layer"]}
    params["scales"]["cpu"]["max_length"] = {"sst": 32, "cfimdb": 32, "quora": 32, "sts": 32}
    tiny_sentiment_scale(
        params, batch_size=8, epochs={"last-layer": 1, "full": 1}, train_examples={"sst": 0, "cfimdb": 0}
    )
    tiny_multitask_scale(
        params, epochs=1, batch_size={"sst": 8, "quora": 8, "sts": 8}, test_predictions=False
    )


@pytest.fixture(scope="module")
def small_pipeline(tmp_path_factory, shared_data, tiny_checkpoint):
    """The project's pipeline with one sentiment run and one multitask configuration,
    committed without results: the sweep's experiments produce them."""
    root = make_project(
        tmp_path_factory.mktemp("sweep"), shared_data, tiny_checkpoint, 24, _one_config_one_run
    )
    _run(["git", "add", "-A"], root)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pipeline"], root)
    return root


@pytest.mark.slow
def test_queued_seed_study_runs_and_is_aggregated(small_pipeline):
    """`minbert seed-study` queues the study's configurations for each seed through DVC's
    experiment queue, waits for them and writes their metrics per seed; `minbert
    sweep-report` aggregates the same experiments."""
    root = small_pipeline
    try:
        out = _run(["minbert", "seed-study"], root)
    finally:
        subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=root, env=tool_env(), capture_output=True)
    assert "seeds [1, 2]" in out
    study = json.loads((root / "metrics" / "seed-study.json").read_text())
    assert study["command"] == "minbert seed-study" and study["seeds"] == [1, 2]
    runs = study["configs"]["baseline"]
    assert [r["seed"] for r in runs] == [1, 2] and runs[0]["average"] != runs[1]["average"]
    # Each row names the commit whose code it ran (the experiments' baseline) and its device.
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout
    assert {r["code"] for r in runs} == {head[:7]} and {r["device"] for r in runs} == {
        f"cpu ({threads_each(2)} threads)"
    }
    # Two experiments at once: each stage ran with the cores ÷ 2 threads (its record says).
    experiments = [r for r in collect_runs(root, ["HEAD"]) if r.name != "workspace"]
    assert len(experiments) == 2
    for run in experiments:
        assert run.metrics["multitask/baseline"].device == f"cpu ({threads_each(2)} threads)", run.name
    # The settings its runs share (all but the seed), which the report checks the tables' run against.
    shared = {settings_digest(run.metrics["multitask/baseline"]) for run in experiments}
    assert study["settings"]["baseline"] == shared.pop() and not shared
    # The untrained checkpoint fitted with each seed beside them, by its own stage.
    assert list(study["settings"]) == ["baseline", UNTRAINED]
    assert [r["seed"] for r in study["configs"][UNTRAINED]] == [1, 2]
    fitted = {settings_digest(run.metrics[study_entry(UNTRAINED)[1]]) for run in experiments}
    assert study["settings"][UNTRAINED] == fitted.pop() and not fitted
    # One entry again: the others stay as the study held them.
    kept = json.loads(json.dumps(study["configs"]["baseline"]))
    _run(["minbert", "seed-study", "--no-queue", "--only", UNTRAINED], root)
    again = json.loads((root / "metrics" / "seed-study.json").read_text())
    assert again["configs"]["baseline"] == kept and list(again["configs"]) == ["baseline", UNTRAINED]
    out = _run(["minbert", "sweep-report", "--out", "sweep.md"], root)
    # The baseline commit has no results (no `dvc repro` before the sweep): only the
    # two seeds make up the one group.
    assert "2 runs in 1 group(s)" in out and "Seeds: 1, 2" in out
    row = next(line for line in out.splitlines() if line.startswith("| `multitask/baseline` |"))
    assert row.endswith("| 2 |") and row.count("±") == 4
    assert (root / "sweep.md").read_text() == out


def test_seed_study_takes_only_other_seeds_of_the_same_parameters_from_their_own_files():
    params = {"seed": 11711, "optimizer": "adamw"}

    def run(name, seed, config_seeds, optimizer="adamw"):
        metrics = {f"multitask/{c}": multitask(s, average=0.5 + s / 1e5) for c, s in config_seeds.items()}
        return Run(name, {"seed": seed, "optimizer": optimizer}, metrics, code=f"{seed:07d}abc")

    runs = [
        run("workspace", 11711, {"a": 11711, "b": 11711}),
        run("exp-1", 1, {"a": 1, "b": 11711}),  # b was not retrained: its file is seed 11711's
        run("exp-2", 2, {"a": 2, "b": 2}),
        run("other", 3, {"a": 3, "b": 3}, optimizer="adamaxw"),
    ]  # another study altogether
    study = seed_study(runs, params, ["a", "b"])
    # The pipeline's own seed (11711) is never copied: the report reads its metrics files.
    assert [r["seed"] for r in study["a"]] == [1, 2]
    assert [r["seed"] for r in study["b"]] == [2]
    # Each row says whose code made it and where (the experiment's baseline commit, its device).
    assert [(r["code"], r["device"]) for r in study["a"]] == [
        ("0000001", _MULTITASK.device),
        ("0000002", _MULTITASK.device),
    ]
    with pytest.raises(ValueError, match="no finished run of configuration 'c'"):
        seed_study(runs, params, ["c"])


def test_seed_study_ignores_parameters_no_multitask_stage_reads():
    """A run with MLM pretraining switched on (or another list of study seeds) trained the
    same configurations: it counts; one with another optimizer does not."""
    params = {"seed": 11711, "optimizer": "adamw", "mlm": {"pretrain": []}, "seed_study": {"seeds": [1]}}

    def run(name, seed, **changed):
        p = {**params, "seed": seed, **changed}
        m = multitask(seed)
        return Run(name, p, {"multitask/a": m})

    runs = [
        run("mlm-on", 1, mlm={"pretrain": ["continue"]}),
        run("more-seeds", 2, seed_study={"seeds": [1, 2, 3]}),
        run("other-optimizer", 3, optimizer="adamaxw"),
    ]
    assert [r["seed"] for r in seed_study(runs, params, ["a"])["a"]] == [1, 2]


def test_seed_study_counts_a_run_of_another_commit_only_where_its_stage_ran_the_current_code():
    params = {"seed": 11711}

    def lock(md5, seed=11711):  # the settings file holds the seed: not compared
        deps = [{"path": "src/x.py", "md5": md5}, {"path": "data/settings/multitask/a.json", "md5": seed}]
        return {"multitask@a": {"deps": deps}}

    def run(name, seed, md5):
        m = multitask(seed)
        return Run(name, {"seed": seed}, {"multitask/a": m}, lock(md5, seed))

    runs = [run("same", 1, "abc"), run("older-code", 2, "old")]
    assert [r["seed"] for r in seed_study(runs, params, ["a"], lock("abc"))["a"]] == [1]
    assert [r["seed"] for r in seed_study(runs, params, ["a"])["a"]] == [1, 2]  # no lock: all count


def test_seed_study_compares_the_features_stage_not_the_features_of_another_seed():
    """The features encode the seed's own training rows, so their hash differs by seed: a
    run counts when the features stage that made them ran the current code."""
    params = {"seed": 11711}

    def lock(seed, features_code="f1"):
        multitask = [{"path": "src/x.py", "md5": "abc"}, {"path": "data/features", "md5": f"rows-{seed}"}]
        features = [
            {"path": "src/f.py", "md5": features_code},
            {"path": "data/settings/features.json", "md5": seed},
        ]
        return {"multitask@a": {"deps": multitask}, "features": {"deps": features}}

    def run(name, seed, features_code):
        m = multitask(seed)
        return Run(name, {"seed": seed}, {"multitask/a": m}, lock(seed, features_code))

    runs = [run("current", 1, "f1"), run("older-features", 2, "f0")]
    assert [r["seed"] for r in seed_study(runs, params, ["a"], lock(11711))["a"]] == [1]


def test_collect_runs_counts_workspace_experiments_and_says_why_one_is_left_out(monkeypatch, capsys):
    # `dvc exp run` in the workspace leaves an experiment with no queue state: it counts
    # when it has results; queued, running and failed ones do not, and each is named.
    import dvc.api

    from minbert.tools import sweep

    rows = [
        {"rev": "workspace", "typ": "workspace"},
        {"rev": "base", "typ": "baseline", "Experiment": None},
        {"rev": "e1", "typ": "branch_commit", "Experiment": "in-workspace", "State": None},
        {"rev": "e2", "typ": "branch_commit", "Experiment": "queued-ok", "State": "Success"},
        {"rev": "e3", "typ": "branch_commit", "Experiment": "broken", "State": "Failed"},
        {"rev": "e4", "typ": "branch_commit", "Experiment": "waiting", "State": "Queued"},
        {"rev": "e5", "typ": "branch_commit", "Experiment": "empty", "State": None},
    ]
    monkeypatch.setattr(dvc.api, "exp_show", lambda repo, revs=None: rows)

    def read_run(repo, rev, name, experiment=False):
        assert experiment == (rev != "base")
        metrics = {} if rev == "e5" else {"multitask/best": multitask()}
        return Run(name, {"seed": rev}, metrics)

    monkeypatch.setattr(sweep, "read_run", read_run)
    runs = sweep.collect_runs()
    assert [r.name for r in runs] == ["base", "in-workspace", "queued-ok"]
    out = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "broken is failed: left out" in out and "waiting is queued: left out" in out
    assert "empty has no metrics files: left out" in out


def test_the_mlm_study_keeps_the_experiments_runs_predictions_and_what_they_compare_with(tmp_path):
    """`minbert mlm-study`'s copy out of an experiment's commit: the MLM runs' metrics files
    and records (not their histories), the fine-tuned runs' dev predictions (read through
    DVC at that commit), and the metrics of the configuration each is compared with."""
    from minbert.results import read_result, write_result
    from minbert.tools.mlm_study import keep

    repo = tmp_path / "repo"
    repo.mkdir()
    _run(["git", "init", "-q"], repo)
    _run(["dvc", "init", "-q"], repo)
    write_result(repo / "metrics" / "mlm", "continue", {"accuracy": 0.05}, {"start": "continue"})
    (repo / "metrics" / "mlm" / "continue-history.csv").write_text("epoch\n0\n")
    tuned = {"sst": 0.4, "quora": 0.7, "sts": 0.5, "average": 0.53}
    # A whole run record (the committed study's), of this configuration and start.
    committed = read_result(REPO / "metrics" / "mlm-study" / "multitask-mlm" / "continue-baseline.json")
    numbers = tuned | {k: committed[k] for k in ("epoch", "steps")}
    record = {k: v for k, v in committed.items() if k not in numbers} | {
        "config": "baseline",
        "pretraining": {"start": "continue", "directory": "models/mlm/continue"},
    }
    write_result(repo / "metrics" / "multitask-mlm", "continue-baseline", numbers, record)
    baseline = {"sst": 0.41, "quora": 0.69, "sts": 0.52, "average": 0.54}
    (repo / "metrics" / "multitask").mkdir()
    (repo / "metrics" / "multitask" / "baseline.json").write_text(json.dumps(baseline))
    for task in ("sst", "quora", "sts"):
        path = repo / "predictions" / "multitask-mlm" / "continue-baseline" / f"{task}-dev-out.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"id,Predicted\n{task}-1,1\n")
    # What each stage read, as the experiment's dvc.lock holds it (a stale entry left besides).
    read = {"deps": [{"path": "src/minbert/train/mlm.py", "hash": "md5", "md5": "0" * 32}]}
    stages = {"mlm@continue": read, "multitask-mlm@continue-baseline": read}
    lock = {"schema": "2.0", "stages": {**stages, "multitask-mlm@other-baseline": read}}
    (repo / "dvc.lock").write_text(yaml.safe_dump(lock))
    _run(["git", "add", "-A"], repo)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "experiment"], repo)
    commit = _run(["git", "rev-parse", "HEAD"], repo).strip()
    # The workspace has moved on since: the copy reads the experiment's commit.
    (repo / "metrics" / "multitask" / "baseline.json").write_text(json.dumps({**baseline, "average": 0.6}))

    provenance = keep(repo, commit, "mlm-study-x", "how it ran")
    study = repo / "metrics" / "mlm-study"
    assert sorted(p.relative_to(study).as_posix() for p in study.rglob("*") if p.is_file()) == [
        "mlm/continue-run.json",
        "mlm/continue.json",
        "multitask-mlm/continue-baseline-run.json",
        "multitask-mlm/continue-baseline.json",
        "predictions/multitask-mlm/continue-baseline/quora-dev-out.csv",
        "predictions/multitask-mlm/continue-baseline/sst-dev-out.csv",
        "predictions/multitask-mlm/continue-baseline/sts-dev-out.csv",
        "study.json",
    ]
    assert provenance["compared_with"] == {"baseline": baseline}
    assert provenance["stages"] == stages  # the runs' own stages, not every entry of the lock
    assert provenance["experiment"] == "mlm-study-x" and provenance["experiment_commit"] == commit
    assert json.loads((study / "study.json").read_text()) == provenance


def test_seed_study_fits_the_untrained_checkpoint_with_each_seed_from_its_own_stage():
    """The untrained checkpoint is an entry of the study: its metrics file, written by the
    zero-shot stage with the run's seed and, given a lock, that stage's current code."""
    params = {"seed": 11711}
    zero_shot = read_run(ZeroShotRunFile, REPO / "metrics" / "zero-shot.json")

    def lock(md5):
        return {"zero-shot": {"deps": [{"path": "src/z.py", "md5": md5}]}}

    def run(name, seed, md5, file_seed=None):
        m = replace(zero_shot, seed=file_seed or seed, scores={**zero_shot.scores, "average": seed / 10})
        return Run(name, {"seed": seed}, {"metrics/zero-shot": m}, lock(md5))

    runs = [run("one", 1, "abc"), run("older-code", 2, "old"), run("not-rerun", 3, "abc", file_seed=11711)]
    study = seed_study(runs, params, [UNTRAINED], lock("abc"))
    assert [(r["seed"], r["average"]) for r in study[UNTRAINED]] == [(1, 0.1)]
    assert study_entry(UNTRAINED) == ("zero-shot", "metrics/zero-shot")
    assert study_entry("best") == ("multitask@best", "multitask/best")


def test_a_study_of_some_entries_keeps_the_others_as_the_study_held_them():
    before = {
        "configs": {"a": [{"seed": 1}], "b": [{"seed": 1}], "gone": [{"seed": 1}]},
        "settings": {"a": "da", "b": "db", "gone": "dg"},
    }
    rows, digests = beside(before, {UNTRAINED: [{"seed": 2}]}, {UNTRAINED: "dz"}, ["a", "b", UNTRAINED])
    assert list(rows) == ["a", "b", UNTRAINED] and rows["a"] == [{"seed": 1}]
    assert digests == {"a": "da", "b": "db", UNTRAINED: "dz"}
    rows, _ = beside(before, {"a": [{"seed": 5}]}, {"a": "da2"}, ["a", "b"])
    assert rows == {"a": [{"seed": 5}], "b": [{"seed": 1}]}
