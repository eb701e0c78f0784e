"""What the report's conclusions rest on: the seed study beside each paired interval,
each run's training budget, SMART's measured terms, what chose the epochs and learning
rates, and prose whose numbers come from the metrics (synthetic outputs, shaped as in
tests/test_report.py)."""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from conftest import REPO
from test_report import (
    CONFIGS,
    PAPER,
    _row,
    _sections,
    _write_run,
    report,
    save,
    table_shapes,
    write_labels,
    write_multitask,
    write_zero_shot,
)

from minbert import metrics
from minbert.report import write_report
from minbert.report.comparisons import (
    BUDGETS_DIFFER,
    SHOWN,
    UNCONFIRMED,
    VERDICTS,
    WITHIN_NOISE,
    ran_at,
    seed_detectable,
    settings_digest,
)
from minbert.report.counted_runs import load_runs
from minbert.report.first_page import whole_report
from minbert.report.formatting import COLUMN_TITLES, COLUMNS
from minbert.report.studies import SEARCH_VARIES
from minbert.report.summary import beside_the_paper
from minbert.report.writer import gpu_study
from minbert.results import read_result
from minbert.runs.training import MultitaskRunFile, SentimentRunFile, read_run, read_runs
from minbert.tasks import AVERAGE, MULTITASK_TASKS

DIFFERENCE = re.compile(r"^[+-]\d\.\d{3} \[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\]")


@pytest.fixture(autouse=True, scope="module")
def fewer_resamples():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metrics, "BOOTSTRAP_RESAMPLES", 999)
        yield


def _outputs(root: Path, configs: list[str]) -> Path:
    write_labels(root)
    write_multitask(root, configs)
    return root


def _seed_rows(config_values: dict[int, float]) -> list[dict]:
    """Seed-study rows whose every column is the given value for that seed."""
    return [
        {"seed": seed, "run": f"seed-{seed}", "average": v, **dict.fromkeys(MULTITASK_TASKS, v)}
        for seed, v in config_values.items()
    ]


def _write_seed_study(root: Path, configs: dict[str, dict[int, float]]) -> None:
    """The study file as `minbert seed-study` writes it: the extra seeds only."""
    study = {
        "command": "minbert seed-study",
        "how": "queues experiments",
        "seeds": sorted({seed for values in configs.values() for seed in values}),
        "configs": {c: _seed_rows(v) for c, v in configs.items()},
    }
    (root / "metrics" / "seed-study.json").write_text(json.dumps(study))


def _own_gap(root: Path, config: str, parent: str) -> float:
    """``config``'s average minus ``parent``'s with the tables' own seed (their metrics files)."""
    directory = root / "metrics" / "multitask"
    return (
        read_result(directory / f"{config}.json")["average"]
        - read_result(directory / f"{parent}.json")["average"]
    )


def _edit(directory: Path, name: str, **changes) -> None:
    """Change a run's metrics file or record, each key where the stage writes it."""
    save(directory, name, read_result(directory / f"{name}.json") | changes)


def _excludes_zero(cell: str) -> bool:
    low, high = map(float, DIFFERENCE.match(cell.strip("*")).groups())
    return low > 0 or high < 0


def test_a_sign_that_holds_with_every_seed_is_not_bold_when_the_interval_over_seeds_contains_zero(tmp_path):
    root = _outputs(tmp_path, ["best", "best-adamw"])
    own = _own_gap(root, "best-adamw", "best")
    # Higher with all 3 seeds (1, 2 and the own seed), by amounts too unequal to separate.
    _write_seed_study(root, {"best": {1: 0.5, 2: 0.5}, "best-adamw": {1: 0.51, 2: 1.1}})
    assert own > 0
    text = report(root, tmp_path / "scattered")
    table4 = _sections(text)["Table 4"]
    delta = _row(table4, "(`best-adamw`)")[-1]
    assert _excludes_zero(delta), delta  # the dev interval alone would have made it bold
    assert not delta.startswith("**") and delta.endswith(" †"), delta
    clause = next(x for x in table4.splitlines() if x.startswith("- `best-adamw` vs `best`: "))
    assert re.search(r"Average \S+ \[\S+, \S+\]: not confirmed by the seeds \(over 3 seeds ", clause), clause
    # The seed study says the same of it: one record, one verdict.
    said = _sections(text)["Seed study"]
    (seed_line,) = [x for x in said.splitlines() if x.startswith("- `best-adamw` vs `best`: ")]
    assert seed_line.split(": ", 1)[1].removesuffix(".") in clause
    # So scattered that the seeds rule out little: their interval is stated, not a verdict
    # on the size the seeds could have detected (a planning figure in its own column).
    diffs = [0.51 - 0.5, 1.1 - 0.5, own]
    detectable = seed_detectable(diffs)
    assert detectable > abs(statistics.mean(diffs))
    assert "which rules out a difference below" in seed_line and "measurable" not in text
    assert _row(said, "| `best-adamw` |")[-1] == f"{detectable:.3f}"

    # The same dev interval, with per-seed differences close to the own seed's, is shown.
    _write_seed_study(
        root, {"best": {1: 0.5, 2: 0.5}, "best-adamw": {1: 0.5 + own + 0.01, 2: 0.5 + own - 0.01}}
    )
    text = report(root, tmp_path / "tight")
    table4 = _sections(text)["Table 4"]
    assert _row(table4, "(`best-adamw`)")[-1] == f"**{delta.removesuffix(' †')}**"
    clause = next(x for x in table4.splitlines() if x.startswith("- `best-adamw` vs `best`: "))
    assert re.search(r"Average \S+ \[\S+, \S+\]: shown \(over 3 seeds \S+ \[\S+, \S+\], p ", clause), clause
    assert "(one comparison)" in clause  # the family: the comparisons with `best`, one here
    assert "so does the paired 95% interval over seeds" in _sections(text)["How to read the tables"]
    assert "as shown (bold) in 1 (`best-adamw` vs `best`)" in _sections(text)["Findings"]


def test_a_row_with_other_steps_is_not_bold_even_when_the_seeds_separate_it(tmp_path):
    root = _outputs(tmp_path, ["baseline", "best"])
    own = _own_gap(root, "best", "baseline")
    _write_seed_study(
        root,
        {"baseline": {1: 0.3, 2: 0.3, 3: 0.3}, "best": {1: 0.3 + own, 2: 0.31 + own, 3: 0.29 + own}},
    )
    table2 = _sections(report(root, tmp_path / "report"))["Table 2"]
    delta = _row(table2, "(`best`)")[-1]
    assert _excludes_zero(delta) and delta.endswith(" ‡") and not delta.startswith("**"), delta
    # PCGrad makes one step where round-robin makes three, on the same examples.
    assert _row(table2, "(`best`)")[-2] == "60 / 4,320"
    assert _row(table2, "(`baseline`)")[-2] == "180 / 4,320"
    clause = next(x for x in table2.splitlines() if x.startswith("- `best` vs `baseline`: "))
    assert (
        ": budgets differ (60 optimizer steps against 180, the same 4,320 training examples seen, "
        "over 4 seeds "
    ) in clause
    assert ": shown" not in clause


def test_every_multitask_table_shows_steps_and_examples(tmp_path):
    root = _outputs(tmp_path, ["baseline", "best", "best-round-robin-equal"])
    sections = _sections(report(root, tmp_path / "report"))
    for name in ("Table 2", "Table 3", "Table 4"):
        header = next(line for line in sections[name].splitlines() if line.startswith("|"))
        assert "| Steps / examples |" in header, name
    table4 = sections["Table 4"]
    assert _row(table4, "(`best-round-robin-equal`)")[-2] == "60 / 4,320"
    assert _row(table4, "(`best-summed`)")[-2] == "not run"  # a row the paper does not have
    assert _row(table4, "(`best-summed`)")[4] == "—"
    assert "- `best-round-robin-equal` vs `best`" in table4
    assert "(budgets differ" not in table4.split("- `best-round-robin-equal` vs `best`")[1].split("\n")[0]
    provenance = sections["How each number was produced"]
    assert "| Optimizer steps / examples seen |" in next(
        x for x in provenance.splitlines() if x.startswith("| Run")
    )
    assert "60 / 4,320" in _row(provenance, "`best-round-robin-equal`")


def test_smart_terms_and_their_control(tmp_path):
    root = _outputs(tmp_path, ["best", "best-no-smart"])
    _edit(
        root / "metrics" / "multitask",
        "best",
        smart={
            "adversarial": {"sst": 0.0123, "quora": 0.00456, "sts": 0.0789},
            "adversarial_control": {"sst": 0.0111, "quora": 0.0, "sts": 0.0012},
        },
    )
    table4 = _sections(report(root, tmp_path / "report"))["Table 4"]
    assert _row(table4, "| `best` | 0.0123") == [
        "`best`",
        "0.0123",
        "0.0111",
        "0.00456",
        "0",
        "0.0789",
        "0.0012",
    ]
    assert "| `best-no-smart` | 0" not in table4  # SMART off: not in the SMART table
    assert "The control is the same divergence with no perturbation" in table4


def test_a_metrics_file_without_the_new_keys_is_an_error(tmp_path):
    root = _outputs(tmp_path, ["baseline", "best"])
    m = read_result(root / "metrics" / "multitask" / "best.json")
    del m["steps"], m["smart"]
    save(root / "metrics" / "multitask", "best", m)
    with pytest.raises(ValueError, match=r"best\.json: missing steps: written by another version"):
        report(root, tmp_path / "report")
    assert not (tmp_path / "report").exists()


def _params(tmp_path: Path) -> Path:
    params = {
        "scale": "cpu",
        "scales": {
            name: {
                "multitask": {
                    "validation_examples": {"sst": size, "quora": 2 * size, "sts": size},
                    "optimizers": {
                        "adamw": {"lr": lr, "head_lr": lr, "lr_schedule": "constant", "weight_decay": 0.01},
                        "adamaxw": {
                            "lr": 1e-4,
                            "head_lr": 1e-4,
                            "lr_schedule": "exponential",
                            "lr_gamma": 0.9,
                            "weight_decay": 0.01,
                        },
                    },
                }
            }
            for name, size, lr in (("cpu", 11, 3e-5), ("gpu", 427, 7e-5), ("paper", 431, 1e-5))
        },
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path / "params.yaml"


def _family_search(root: Path, grids: dict, members: dict, ran_at: dict | None = None) -> None:
    """metrics/lr-search.json as `minbert lr-search FAMILY` writes it: ``grids`` maps
    (family, config, optimizer) to each rate's scores over seeds 101-103."""
    from test_lr_search import _point

    from minbert.runs.study_files import FamilySearchFile, write_family_search
    from minbert.tools.lr_search import choose

    points = [
        _point(lr, seed, s, optimizer, family=family, config=config, ran_at=ran_at or {})
        for (family, config, optimizer), grid in grids.items()
        for lr, scores in grid.items()
        for seed, s in zip((101, 102, 103), scores)
    ]
    study = FamilySearchFile("minbert lr-search", "each point: dvc exp run", points, choose(points, members))
    write_family_search(study, root / "metrics" / "lr-search.json")


def _ran_at(root: Path, config: str, lr: float, head_lr: float) -> None:
    """Record that the tables' run of ``config`` trained at these rates."""
    settings = read_result(root / "metrics" / "multitask" / f"{config}.json")["settings"]
    _edit(root / "metrics" / "multitask", config, settings=settings | {"lr": lr, "head_lr": head_lr})


def test_what_chose_what(tmp_path):
    root = _outputs(tmp_path, ["baseline", "best"])
    # The baseline ran its family's choice; the fixture's `best` ran lr 5e-05, off the grid.
    _ran_at(root, "baseline", 5e-5, 1e-3)
    grids = {
        ("siamese", "baseline", "adamw"): {
            3e-5: (0.20, 0.21, 0.22), 5e-5: (0.31, 0.32, 0.33), 1e-4: (0.1, 0.12, 0.14)
        },
        ("best", "best", "adamaxw"): {1e-4: (0.4, 0.41, 0.39), 3e-4: (0.3, 0.35, 0.32)},
    }  # fmt: skip
    _family_search(root, grids, {("siamese", "adamw"): ["baseline"], ("best", "adamaxw"): ["best"]})
    write_report(
        root / "metrics", root / "predictions", root / "prepared", PAPER, tmp_path / "r", _params(tmp_path)
    )
    section = _sections(whole_report(tmp_path / "r"))["What chose what"]
    paper = yaml.safe_load(PAPER.read_text(encoding="utf-8"))
    # The scale that ran: its metrics (validation 60 per task); the others: params.yaml.
    cpu, gpu, scale_paper = (_row(section, f"| `{s}` (") for s in ("cpu", "gpu", "paper"))
    assert cpu[:2] == ["`cpu` (the runs above)", "SST 60, Quora 60, STS 60"]
    assert "adamw lr 5e-05 (heads 0.001), × 0.9 per epoch" in cpu[2]
    assert gpu[1] == "SST 427, Quora 854, STS 427" and "adamw lr 7e-05 (heads 7e-05), constant" in gpu[2]
    assert scale_paper[1] == "SST 431, Quora 862, STS 431"
    for row, scale in ((gpu, "gpu"), (scale_paper, "paper")):
        assert row[3] == paper["learning_rates"][scale]
    # The scale that ran: what chose its rates, from the search's own file.
    assert cpu[3].startswith(
        "`minbert lr-search FAMILY` on the validation split over seeds 101, 102, 103, never dev"
    )
    assert "best's adamaxw on `best` (lr 0.0001); siamese's adamw on `baseline` (lr 5e-05)" in cpu[3]
    assert "not searched" not in cpu[3]
    assert "Dev is scored twice per configuration, at its start (epoch 0, for the controls)" in section
    assert "the history's `dev_*` columns: SST 100, Quora 100, STS 100" in section
    assert "The epoch of each multitask run: the epoch with the best mean of SST MCC, Quora MCC" in section
    # The grids: each rate's mean, the chosen one bold with its interval, and where the
    # tables' runs stand against it.
    baseline = _row(section, "| `cpu` | siamese | adamw | `baseline` |")
    assert baseline[4:7] == [
        "0.210 (+0.110 [+0.110, +0.110] §)",
        "**0.320** [0.295, 0.345]",
        "0.120 (+0.200 [+0.175, +0.225] §)",
    ]
    assert baseline[-1] == "`baseline`: lr 5e-05, the chosen rate"
    best = _row(section, "| `cpu` | best | adamaxw | `best` |")
    assert best[-1] == "`best`: lr 5e-05 (not on the grid)"

    # A search file an older command wrote is an error, not a half-empty table.
    old = json.loads((root / "metrics" / "lr-search.json").read_text())
    old["points"][0].pop("validation_selection")
    (root / "metrics" / "lr-search.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"a point lacks validation_selection: written by an older"):
        report(root, tmp_path / "old")
    (root / "metrics" / "lr-search.json").unlink()
    section = _sections(report(root, tmp_path / "r2"))["What chose what"]
    assert "Learning rates by family" not in section
    assert _row(section, "| `cpu` (")[3] == paper["learning_rates"]["cpu"]
    assert "`gpu`" not in section  # without params.yaml: the scale that ran only


def test_a_run_no_family_choice_covers_is_named(tmp_path):
    root = _outputs(tmp_path, ["baseline", "best"])
    grids = {("best", "best", "adamaxw"): {1e-4: (0.4, 0.41, 0.39)}}
    _family_search(root, grids, {("best", "adamaxw"): ["best"]})
    cpu = _row(_sections(report(root, tmp_path / "r"))["What chose what"], "| `cpu` (")
    assert cpu[3].endswith("best's adamaxw on `best` (lr 0.0001); not searched: `baseline` (params.yaml)")


def test_the_papers_silences_quote_the_metrics_not_prose(tmp_path):
    root = _outputs(tmp_path, ["best", "best-round-robin", "cosine-sts"])
    history = root / "metrics" / "multitask" / "cosine-sts-history.csv"
    frame = pd.read_csv(history)
    frame["dev_sts_pearson"] = [0.8233, 0.8105, 0.79, 0.775]
    frame.to_csv(history, index=False)
    _edit(root / "metrics" / "multitask", "cosine-sts", epoch=1)
    silent = _sections(report(root, tmp_path / "report"))[
        "Where the paper is silent, and what this pipeline chose"
    ]
    assert "5·cos(u, v)" in silent and "label/5" in silent
    assert (
        "is 0.823 at epoch 0, the checkpoint before any encoder update, and 0.810 at its chosen epoch 1"
        in silent
    )
    assert "`best-round-robin` made 180 optimizer steps over 4,320 training examples" in silent
    assert "`best-summed` has not been run" in silent
    assert "lambda_s 1" in silent  # SMART's settings as run
    # Its per-token bound against the reference code's, from the runs' own settings.
    norm = read_run(MultitaskRunFile, root / "metrics" / "multitask" / "best.json").settings.smart.token_norm
    assert (
        f"scaled to {norm:g} times the reference code's size (per-token norm {norm:g} against its 1)"
        in silent
    )
    assert not re.search(r"(?<![\d,])(320|192)\b", silent)  # no training size written as prose
    assert "{" not in silent


def test_an_unknown_fact_in_paper_yaml_is_an_error(tmp_path):
    root = _outputs(tmp_path, ["best"])
    paper = yaml.safe_load(PAPER.read_text(encoding="utf-8"))
    paper["choices"] = ["Trained {epochs} epochs."]
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(paper), encoding="utf-8")
    with pytest.raises(ValueError, match=r"\{epochs\} is not a known fact"):
        report(root, tmp_path / "report", tmp_path / "paper.yaml")


# An MLM stage's metrics file and record: a fresh head, trained a little.
# An MLM run as its stage writes it (the committed study's record), with these numbers.
PRETRAINING = read_result(REPO / "metrics" / "mlm-study" / "mlm" / "continue.json") | {
    "start": "continue",
    "before": {"masked_accuracy": 0.0, "perplexity": 40000.0, "loss": 10.6, "masked_tokens": 50},
    "accuracy": 0.05,
    "after": {"perplexity": 1200.0, "loss": 7.1, "masked_tokens": 50},
    "corpus": {
        "train_sequences": 100,
        "heldout_sequences": 5,
        "train_tokens": 4000,
        "sources": {},
        "text": "",
    },
    "head": "freshly initialised",
}


def test_mlm_table_shows_the_budget_and_marks_an_unchecked_sign(tmp_path):
    root = _outputs(tmp_path, ["baseline"])
    save(root / "metrics" / "mlm", "continue", PRETRAINING)
    base = read_result(root / "metrics" / "multitask" / "baseline.json")
    scores = _write_run(root, "multitask-mlm/continue-baseline", 0.9, seed=CONFIGS.index("best"))
    tuned = (
        base
        | scores
        | {"pretraining": {"start": "continue", "directory": "models/mlm/continue"}, "steps": 90}
    )
    save(root / "metrics" / "multitask-mlm", "continue-baseline", tuned)
    section = _sections(report(root, tmp_path / "report"))["MLM pretraining before fine-tuning"]
    header = next(line for line in section.splitlines() if line.startswith("| Configuration"))
    assert "| Steps / examples |" in header
    rows = [line for line in section.splitlines() if line.startswith("| `baseline`")]
    assert [r.split(" | ")[-2] for r in rows] == ["180 / 4,320", "90 / 4,320"]
    # Far better predictions, outside zero, but half the steps (no seed study covers MLM).
    delta = rows[1].strip("| ").split(" | ")[-1]
    assert _excludes_zero(delta) and delta.endswith(" ‡"), delta
    assert re.search(
        r"- `continue-baseline` vs `baseline`: .*: budgets differ \(90 optimizer steps against 180", section
    )


def _mlm_study(root: Path, baseline_then: dict) -> None:
    """What `minbert mlm-study` commits: the experiment's MLM runs under metrics/mlm-study,
    their dev predictions beside them, and its provenance."""
    study = root / "metrics" / "mlm-study"
    save(study / "mlm", "continue", PRETRAINING)
    base = read_result(root / "metrics" / "multitask" / "baseline.json")
    scores = _write_run(root, "study/continue-baseline", 0.9, seed=CONFIGS.index("best"))
    tuned = base | scores | {"pretraining": {"start": "continue", "directory": "models/mlm/continue"}}
    save(study / "multitask-mlm", "continue-baseline", tuned)
    (study / "predictions").mkdir()
    (root / "predictions" / "study").rename(study / "predictions" / "multitask-mlm")
    provenance = {
        "command": "minbert mlm-study",
        "experiment": "mlm-study-abc1234",
        "experiment_commit": "f" * 40,
        "how": "`dvc exp run --temp -S 'mlm.pretrain=[continue]' ...` from commit abc1234",
        "compared_with": {"baseline": baseline_then},
        # What its stages read (here one file), unchanged since: the study counts.
        "stages": {"mlm@continue": {"deps": [{"path": "read.py", "md5": _made(root / "read.py")}]}},
    }
    (study / "study.json").write_text(json.dumps(provenance))


def _made(path: Path) -> str:
    path.write_text("what the stage read\n")
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_mlm_section_reads_the_committed_study_when_the_pipeline_ran_none(tmp_path):
    """The default pipeline leaves MLM off; the section shows the experiment `minbert
    mlm-study` committed, from its own predictions, and its difference from `baseline`
    only while `baseline` is the run it was compared with."""
    root = _outputs(tmp_path, ["baseline"])
    current = json.loads((root / "metrics" / "multitask" / "baseline.json").read_text())
    _mlm_study(root, {k: current[k] for k in (*MULTITASK_TASKS, "average")})
    section = _sections(report(root, tmp_path / "report"))["MLM pretraining before fine-tuning"]
    assert "`minbert mlm-study` ran it as the experiment `mlm-study-abc1234`" in section
    assert "| `continue` | 0.000 | 0.050 |" in section
    rows = [line for line in section.splitlines() if line.startswith("| `baseline`")]
    delta = rows[1].strip("| ").split(" | ")[-1]
    assert _excludes_zero(delta), delta  # far better predictions, from the study's own folder
    # Once `baseline` is retrained, the study's comparison is stale: no difference shown.
    stale = {k: current[k] for k in (*MULTITASK_TASKS, "average")} | {"average": 0.123}
    _mlm_study_provenance = root / "metrics" / "mlm-study" / "study.json"
    provenance = json.loads(_mlm_study_provenance.read_text())
    provenance["compared_with"]["baseline"] = stale
    _mlm_study_provenance.write_text(json.dumps(provenance))
    section = _sections(report(root, tmp_path / "report2"))["MLM pretraining before fine-tuning"]
    assert "`baseline` has been retrained since the MLM study at the same settings (then 0.123" in section
    assert "rerun `minbert mlm-study`" in section
    assert [line for line in section.splitlines() if line.startswith("| `baseline`")][0].endswith("| — |")
    # A study run at other settings than the current run says which, whatever the scores.
    provenance["compared_with"]["baseline"] = {k: current[k] for k in (*MULTITASK_TASKS, "average")}
    _mlm_study_provenance.write_text(json.dumps(provenance))
    record = next((root / "metrics" / "mlm-study").rglob("continue-baseline-run.json"))
    values = json.loads(record.read_text())
    lr = values["settings"]["lr"]
    values["settings"]["lr"] = lr * 10
    record.write_text(json.dumps(values))
    section = _sections(report(root, tmp_path / "report3"))["MLM pretraining before fine-tuning"]
    assert f"ran at other settings than the current `baseline`: lr {lr * 10:g} (now {lr:g})" in section
    assert [line for line in section.splitlines() if line.startswith("| `baseline`")][0].endswith("| — |")


def test_mlm_section_without_runs_or_study_says_how_to_run_it(tmp_path):
    root = _outputs(tmp_path, ["baseline"])
    section = _sections(report(root, tmp_path / "report"))["MLM pretraining before fine-tuning"]
    assert "Run it with `minbert mlm-study`" in section


def _collapse_file(path: Path, best: MultitaskRunFile, kept: dict[str, list[float]]) -> Path:
    """A ``bench/smart_collapse.py`` result over seeds 101-103 departing from ``best``'s
    settings: per variant (the first the control) its selection score at epoch 1 by seed;
    a Quora MCC of 0 at its end where its score is below 0.45."""
    smart = asdict(best.settings.smart)
    changes = [{}, {"token_norm": 1.0}, {"warmup": False}]

    def run(seed: int, value: float) -> dict:
        gradient = {"loss": 0.42, "adversarial": 0.00123, "bregman": 0.35, "bregman_value": 0.1}
        return {
            "seed": seed,
            "best_epoch": 1,
            "epochs": [
                {"epoch": 0, "validation": {"quora_mcc": 0.3, "selection": 0.4}},
                {
                    "epoch": 1,
                    "validation": {"quora_mcc": 0.0 if value < 0.45 else 0.31, "selection": value},
                    "head_gradient_quora": gradient,
                },
            ],
        }

    variants = {
        name: {
            "change": change,
            "smart": {**smart, **{k: v for k, v in change.items() if k != "warmup"}},
            "runs": [run(101 + k, v) for k, v in enumerate(values)],
        }
        for (name, values), change in zip(kept.items(), changes)
    }
    results = {"config": "best", "steps": best.steps, "lr": 3e-4, "seeds": [101, 102, 103]}
    results |= {"ran_at": ran_at(best), "variants": variants}
    path.write_text(json.dumps({"args": {"seed": 11711}, "results": results}))
    return path


def test_smart_collapse_section_gives_each_variant_over_seeds_against_the_control(tmp_path):
    from minbert.report.smart_page import smart_collapse_section
    from minbert.runs.study_files import read_smart_measurement

    root = _outputs(tmp_path, ["baseline", "best"])
    runs = {m.config: m for m in load_runs(root / "metrics" / "multitask")}
    kept = {
        "the runs' settings": [0.50, 0.52, 0.51],
        "token_norm 1 (the authors' code)": [0.40, 0.41, 0.46],
        "the runs' settings, no head warm-up": [0.49, 0.53, 0.50],
    }
    file = _collapse_file(tmp_path / "collapse.json", runs["best"], kept)
    text = smart_collapse_section(read_smart_measurement(file), "x.json", runs)
    assert "Each variant changes one thing of the runs' settings (its name says which)" in text
    assert (
        "| Variant | Quora MCC, epoch 0 | Quora MCC, epoch 1 | Quora one constant at the end | "
        "selection (mean) | control minus it (95%, over seeds) | loss | smoothness | Bregman |"
    ) in text
    assert (
        "| the runs' settings (the control) | 0.300 / 0.300 / 0.300 | 0.310 / 0.310 / 0.310 | 0 of 3 "
        "| 0.5100 | — | 0.42 | 0.00123 | 0.35 |"
    ) in text
    assert (
        "| token_norm 1 (the authors' code) | 0.300 / 0.300 / 0.300 | 0.000 / 0.000 / 0.310 | 2 of 3 " in text
    )
    assert "The control minus token_norm 1 (the authors' code): +0.0867 [" in text
    assert "], the control above in 3 of 3 | 0.42 |" in text
    assert "], the control above in 2 of 3 | 0.42 |" in text
    assert "the seeds separate them" in text
    assert "the control minus the runs' settings, no head warm-up: +0.0033 [" in text
    assert "the seeds do not separate them" in text
    assert f"depart from the settings of the tables' `best` ({runs['best'].steps} optimizer steps)" in text
    assert "The tables' runs with SMART use the control's SMART settings." in text
    # Measured at another rate: said so; a SMART run at other settings than the control's is named.
    values = json.loads(file.read_text())
    values["results"]["ran_at"]["lr"] = 1.0
    values["results"]["variants"]["the runs' settings"]["smart"]["token_norm"] = 0.5
    file.write_text(json.dumps(values))
    text = smart_collapse_section(read_smart_measurement(file), "x.json", runs)
    assert (
        "depart from other settings than the tables' `best` (lr differ): they were measured elsewhere" in text
    )
    assert "Not the control's SMART settings: `best`." in text
    assert "No measurement of SMART's variants" in smart_collapse_section(None, "x.json", runs)
    # A file of the older, one-seed form is refused with the command that rewrites it.
    values["results"].pop("seeds")
    file.write_text(json.dumps(values))
    with pytest.raises(ValueError, match="lacks seeds: written by an older `python bench/smart_collapse.py`"):
        read_smart_measurement(file)


def _norm_search(path: Path, best: MultitaskRunFile, scores: dict[float, list[float]], chosen: float) -> Path:
    """A ``bench/smart_norm.py`` result: ``scores`` per norm over seeds 101-103, run at
    ``best``'s settings (the norm apart), its grid as the bench's rule makes it."""
    import smart_norm

    from minbert.runs.study_files import norm_apart

    at = norm_apart(ran_at(best))
    points = [
        {"token_norm": n, "seed": 101 + k, "best_epoch": 1, "start_selection": 0.3, "selection": v}
        for n, values in scores.items()
        for k, v in enumerate(values)
    ]
    found = smart_norm.choose(points)
    assert found["chosen"] == chosen
    results = {"config": "best", "rule": "the highest mean", "ran_at": at, **found, "points": points}
    path.write_text(json.dumps({"results": results}))
    return path


def test_smart_norm_section_says_what_chose_the_norm_and_at_which_settings(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from minbert.report.smart_page import smart_norm_section
    from minbert.runs.study_files import read_smart_norm_search

    root = _outputs(tmp_path, ["baseline", "best"])
    runs = {m.config: m for m in load_runs(root / "metrics" / "multitask")}
    used = runs["best"].settings.smart.token_norm
    scores = {0.003: [0.50, 0.51, 0.49], used: [0.52, 0.53, 0.52], 0.1: [0.40, 0.45, 0.41]}
    file = _norm_search(tmp_path / "norm.json", runs["best"], scores, chosen=used)
    text = smart_norm_section(read_smart_norm_search(file), "x.json", runs)
    assert (
        "| token_norm | seed 101 | seed 102 | seed 103 | mean | chosen minus it (95%, over seeds) |" in text
    )
    assert f"| {used:g} | 0.5200 | 0.5300 | 0.5200 | 0.5233 | (chosen) |" in text
    assert "| 0.003 | 0.5000 | 0.5100 | 0.4900 | 0.5000 | +0.0233 [" in text
    assert f"Chosen: token_norm {used:g}, ahead of the next, 0.003, by +0.0233 [" in text
    assert "the seeds separate them" in text
    assert "The search ran at the settings of the tables' `best` but the norm and seed." in text
    assert f"The tables' runs with SMART use {used:g}, the choice." in text
    # A search at another rate chose elsewhere; a norm the runs do not use is named.
    scores = {0.003: [0.54, 0.56, 0.55], used: [0.52, 0.53, 0.52]}
    file = _norm_search(tmp_path / "norm.json", runs["best"], scores, chosen=0.003)
    values = json.loads(file.read_text())
    values["results"]["ran_at"]["lr"] = 1.0
    file.write_text(json.dumps(values))
    text = smart_norm_section(read_smart_norm_search(file), "x.json", runs)
    assert "ran at other settings than the tables' `best` (lr differ): the norm was chosen elsewhere" in text
    assert f"Not the choice: `best` {used:g}." in text
    assert "No search of SMART's norm" in smart_norm_section(None, "x.json", runs)
    values["results"]["chosen"] = used  # not what its points choose
    file.write_text(json.dumps(values))
    with pytest.raises(ValueError, match=f"x.json: chosen token_norm {used:g}, its points choose 0.003"):
        smart_norm_section(read_smart_norm_search(file), "x.json", runs)
    values["results"].pop("ran_at")
    file.write_text(json.dumps(values))
    with pytest.raises(ValueError, match="lacks ran_at: written by an older `python bench/smart_norm.py`"):
        read_smart_norm_search(file)


def test_cross_cpu_note_gives_the_largest_difference_as_the_tolerance():
    from minbert.report.provenance import cross_cpu_section

    best, summed = {"sst": 0.46, "sts": 0.8014, "epoch": 1}, {"sst": 0.45, "sts": 0.5581, "epoch": 3}
    current = {"best": best, "best-summed": summed, "baseline": {"sst": 0.43}}
    configs = {
        "best": {"committed": best, "identical": True, "differences": {}},
        "best-summed": {
            "committed": summed,
            "identical": False,
            "differences": {"sts": [0.5581, 0.5612], "epoch": [3, 2]},
        },
    }

    def measured(configs: dict, rounds_otherwise: bool = True) -> dict:
        results = {"branch": "AVX2", "rounds_otherwise": rounds_otherwise, "configs": configs}
        return {"machine": {"cpu": "Intel Xeon"}, "started": "2026-11-29T10:30:00", "results": results}

    text = cross_cpu_section(measured(configs), "bench/results/cross_cpu.json", current)
    assert "1 of 2 metrics files identical" in text and "one Intel Xeon machine (2026-11-29)" in text
    assert "largest difference is 0.0031 (`best-summed` sts)" in text
    assert "Not rerun: `baseline`." in text
    same = cross_cpu_section(measured({"best": configs["best"]}), "x.json", current)
    assert "1 of 1 metrics files identical" in same and "largest" not in same
    # A rerun counts only against the numbers it compared: one since retrained is left out.
    moved = cross_cpu_section(measured(configs), "x.json", {**current, "best-summed": {"sts": 0.6}})
    assert "1 of 1 metrics files identical" in moved and "not checked: `best-summed`." in moved
    assert "changed since: none is checked" in cross_cpu_section(measured(configs), "x.json", {})
    # A branch that rounds as the default checks nothing; an older file says what it lacks.
    assert "no check" in cross_cpu_section(measured(configs, rounds_otherwise=False), "x.json", current)
    older = {"machine": {"cpu": "AMD EPYC"}, "results": {"branch": "COMPATIBLE", "configs": {}}}
    assert "did not record what it compared with" in cross_cpu_section(older, "x.json", current)
    assert "Not measured" in cross_cpu_section(None, "x.json", current)


STUDIED = ["baseline", "best", "best-summed", "best-no-smart"]


def _studied(tmp_path: Path) -> Path:
    """Table 4's parent and two of its ablations beside `baseline`, with a seed study:
    best-summed's differences scattered around zero, best-no-smart higher with every seed."""
    root = _outputs(tmp_path, STUDIED)
    _write_seed_study(
        root,
        {
            "baseline": {1: 0.40, 2: 0.41, 3: 0.39},
            "best": {1: 0.50, 2: 0.50, 3: 0.50},
            "best-summed": {1: 0.53, 2: 0.47, 3: 0.51},
            "best-no-smart": {1: 0.51, 2: 0.52, 3: 0.515},
        },
    )
    return root


def test_every_comparison_says_what_the_budget_can_detect_and_why(tmp_path):
    """The budget section: each Table 2-4 comparison with the smallest difference its seeds
    could detect; PCGrad (best-summed vs best) with its cosines and projection share, SMART
    (best-no-smart vs best) with its sign over the seeds."""
    root = _studied(tmp_path)
    section = _sections(report(root, tmp_path / "r"))["What this budget can and cannot detect"]
    summed = _row(section, "`best-summed` vs `best`")
    own = _own_gap(root, "best-summed", "best")
    diffs = [0.03, -0.03, 0.01, own]
    assert summed[2].startswith(f"{statistics.mean(diffs):+.3f} [") and summed[2].endswith("(4 seeds)")
    assert summed[5] == f"{seed_detectable(diffs):.3f}"  # a planning figure, beside the verdict
    assert summed[4] in VERDICTS
    assert "measurable" not in section
    assert "- PCGrad (`best-summed` vs `best`" in section and re.search(
        r"task-gradient cosines \(`[^`]*best-conflicts\.csv`\) over 60 steps: mean", section
    )
    assert "it projected " in section
    assert "- SMART (`best-no-smart` vs `best`" in section
    # Its differences seed by seed beside what those seeds could detect: no second verdict.
    smart = _row(section, "`best-no-smart` vs `best`")
    assert "without SMART minus with it, seed by seed: " in section
    assert f"(the smallest difference these seeds would detect: {smart[5]})" in section
    assert "higher with" not in section
    assert _row(section, "`best` vs `baseline`")[1].startswith("+")  # Table 3's comparison too


def test_the_report_opens_with_the_papers_headline_rows_and_what_the_budget_can_show(tmp_path):
    """The first page: the summary (the count against each run's start, every comparison
    with the verdict the budget page gives it), then Table 2's rows beside the paper's."""
    root = _studied(tmp_path)
    report(root, tmp_path / "r")
    first = (tmp_path / "r" / "README.md").read_text(encoding="utf-8")
    assert next(line for line in first.splitlines() if line.startswith("## ")) == "## Summary"
    summary = _sections(first)["Summary"]
    budget = _sections(whole_report(tmp_path / "r"))["What this budget can and cannot detect"]
    table2 = _sections(first)["Table 2"]
    paper = yaml.safe_load(PAPER.read_text(encoding="utf-8"))
    for row in paper["table2"]["rows"]:
        published = [(row.get("paper") or {}).get(c) for c in COLUMNS]
        if row["config"] in STUDIED and None not in published:
            assert _row(table2, f"(`{row['config']}`)")[-4:] == [f"{v:.3f}" for v in published]
    assert "against its own start (epoch 0), above in " in summary
    for comparison in ("`best` vs `baseline`", "`best-summed` vs `best`", "`best-no-smart` vs `best`"):
        verdict = _row(budget, comparison)[4]
        line = next(x for x in summary.splitlines() if x.startswith(f"- {comparison}: Average "))
        assert f": {verdict} (" in line, (comparison, verdict, line)


def _gpu_study(root: Path, configs: list[str], zero_shot: bool = False) -> None:
    """``metrics/gpu`` as `minbert gpu-unpack` leaves it after one call: the runs' metrics
    and predictions under their own metrics/ and predictions/ (``zero_shot``: the untrained
    checkpoint's too, as `root` has it), and provenance.json."""
    gpu = root / "metrics" / "gpu"
    if zero_shot:
        for path in (root / "metrics").glob("zero-shot*.json"):
            (gpu / "metrics").mkdir(parents=True, exist_ok=True)
            (gpu / "metrics" / path.name).write_bytes(path.read_bytes())
        for path in (root / "predictions" / "zero-shot").glob("*"):
            (gpu / "predictions" / "zero-shot").mkdir(parents=True, exist_ok=True)
            (gpu / "predictions" / "zero-shot" / path.name).write_bytes(path.read_bytes())
    for config in configs:
        for kind in ("metrics", "predictions"):
            source = root / kind / "multitask"
            for path in [*source.glob(f"{config}*"), *source.glob(f"{config}/*")]:
                if path.is_file():
                    target = gpu / kind / "multitask" / path.relative_to(source)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(path.read_bytes())
    for config in configs:  # the record's provenance, as `offline-run` adds it
        _edit(gpu / "metrics" / "multitask", config, offline_run={"device": "NVIDIA H100 80GB HBM3"})
    call = {
        "commit": "aebbd8d6cd45d446d679d6a49a0a1a796942ca19", "uncommitted_changes": [],
        "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0", "python": "3.12.3",
        "checkpoint": {"name": "all-minilm-l6-v2", "source_weights": "model.safetensors",
                       "source_sha256": "53aa5117", "copy": "fp16", "note": "weights stored in fp16"},
        "seconds": 368.0, "finished": {f"multitask@{c}": 63.0 for c in configs},
        "failed": [{"stage": "multitask@best", "reason": "stopped at the --deadline", "seconds": 130.6}],
        "not_run": [],
    }  # fmt: skip
    # Each stage ran with one file of code, as it stands in `root` then.
    code = root / GPU_CODE
    code.parent.mkdir(parents=True, exist_ok=True)
    code.write_text("# the step as it ran on the GPU\n")
    fingerprint = {GPU_CODE: hashlib.sha256(code.read_bytes()).hexdigest(), "cmd of prepare": "0" * 64}
    ran = {"call": CALL, "seconds": 63.0, "files": [], "fingerprint": fingerprint, "log": None}
    stages = {f"multitask@{c}": ran for c in configs} | ({"zero-shot": ran} if zero_shot else {})
    provenance = {
        "format": "minbert-gpu-results/1", "overrides": ["scale=gpu"],
        "calls": {CALL: call}, "stages": stages, "failures": {},
    }  # fmt: skip
    (gpu / "provenance.json").write_text(json.dumps(provenance))


CALL = "2026-11-26T23:01:34.579+00:00"
GPU_CODE = "src/minbert/train/multitask_step.py"  # under the test's root


def test_the_gpu_section_shows_the_unpacked_study_beside_the_paper_with_its_calls(tmp_path):
    root = _outputs(tmp_path, ["baseline", "best"])
    section = _sections(report(root, tmp_path / "before"))["On a GPU"]
    assert section.strip().startswith("No GPU results yet")
    _gpu_study(root, ["baseline"])
    section = _sections(report(root, tmp_path / "report"))["On a GPU"]
    assert "`dvc exp run -S 'scale=gpu'`" in section
    assert (
        "| 2026-11-26T23:01:34 | NVIDIA H100 80GB HBM3 | 2.11.0+cu130 / 13.0 | aebbd8d | 368 | 1 "
        "| `multitask@baseline` 63 s | `multitask@best`: stopped at the --deadline |"
    ) in section
    # The node's predictions, recomputed here: the same as the CPU study's, whose they are.
    cpu = _sections(report(root, tmp_path / "report"))
    cpu_table = cpu["Table 2"]
    gpu_table = section.split("### GPU Table 2")[1].split("### GPU Table 3")[0]
    assert _row(gpu_table, "`baseline`")[:5] == _row(cpu_table, "`baseline`")[:5]
    assert _row(gpu_table, "`best`")[1] == "not run"
    # The headline rows beside the paper (the README's block): `baseline` on the GPU too, `best` not yet.
    summary = _headline(root)
    assert _row(summary, "`baseline`, ours on a GPU")[1:] == _row(summary, "`baseline`, ours")[1:]
    assert not [line for line in summary.splitlines() if "`best`, ours on a GPU" in line]
    assert "Ours on a GPU:" in summary and "on NVIDIA H100 80GB HBM3" in summary
    # The first page's Table 2: the GPU's numbers beside ours, `best` not run there.
    first = _sections((tmp_path / "report" / "README.md").read_text(encoding="utf-8"))["Table 2"]
    baseline = _row(first, "(`baseline`)")
    assert baseline[1:5] == baseline[7:11] and _row(first, "(`best`)")[7] == "not run"


def _headline(root: Path) -> str:
    """The headline rows beside the paper and their prose, as the README's block has them."""
    metrics = root / "metrics"
    on_gpu = gpu_study(metrics, root / "prepared", root)
    tables, prose = beside_the_paper(
        {m.config: m for m in load_runs(metrics / "multitask")},
        read_runs(SentimentRunFile, metrics / "sentiment"),
        yaml.safe_load(PAPER.read_text(encoding="utf-8")),
        on_gpu.multitask,
        on_gpu.sentiment,
        on_gpu.provenance,
        on_gpu.stale,
    )
    return "\n".join([*tables, "", prose])


def test_a_gpu_row_whose_code_changed_since_it_ran_says_so_beside_it(tmp_path):
    root = _outputs(tmp_path, ["baseline", "best"])
    write_zero_shot(root)
    _gpu_study(root, ["baseline"], zero_shot=True)
    sections = _sections(report(root, tmp_path / "current"))
    assert "| `multitask@baseline` | 2026-11-26T23:01:34 | aebbd8d | none |" in sections["On a GPU"]
    assert "Stale" not in sections["On a GPU"] and "stale" not in _headline(root)
    current = _sections((tmp_path / "current" / "README.md").read_text(encoding="utf-8"))["Table 2"]
    assert _row(current, "(`baseline`)")[10] == _row(current, "(`baseline`)")[4]  # the GPU average, not stale
    assert _row(_headline(root), "`baseline`, ours on a GPU")[0] == "`baseline`, ours on a GPU (aebbd8d)"
    (root / GPU_CODE).write_text("# the step as it is now\n")  # its hash is not the one it ran with
    report(root, tmp_path / "stale")
    sections = _sections(whole_report(tmp_path / "stale"))
    section = sections["On a GPU"]
    assert "| `multitask@baseline` | 2026-11-26T23:01:34 | aebbd8d | `multitask_step.py` |" in section
    table = section.split("### GPU Table 2")[1].split("### GPU Table 3")[0]
    label = _row(table, "(`baseline`)")[0]
    note = re.search(r"\[(\d+)\]$", label).group(1)
    assert f"- [{note}] " in table and "Stale: `multitask@baseline` ran at aebbd8d; since then " in table
    assert "`multitask_step.py` changed" in table
    # The untrained checkpoint's row too: its stage's code changed as well.
    untrained = re.search(r"\[(\d+)\]$", _row(table, "(`zero-shot`)")[0]).group(1)
    assert re.search(rf"- \[{untrained}\] No fine-tuning: .*Stale: `zero-shot` ran at aebbd8d", table)
    first = _sections((tmp_path / "stale" / "README.md").read_text(encoding="utf-8"))
    assert _row(first["Table 2"], "(`baseline`)")[10].endswith(" (stale)")
    assert _row(first["Table 2"], "(`zero-shot`)")[10].endswith(" (stale)")
    summary = _headline(root)
    assert _row(summary, "`baseline`, ours on a GPU")[0] == "`baseline`, ours on a GPU (aebbd8d, stale)"
    assert "A GPU row marked stale ran at an earlier commit" in summary
    assert "A GPU row marked stale ran at an earlier commit" in first["Summary"]


def test_a_row_titled_for_settings_its_run_did_not_have_is_titled_by_what_ran(tmp_path):
    # As after `dvc exp run -S optimizer=adamaxw`: `baseline` ran with AdamaxW, which its
    # row's title in the paper ("... round-robin, AdamW") does not say.
    root = _outputs(tmp_path, ["baseline", "best"])
    directory = root / "metrics" / "multitask"
    settings = read_result(directory / "baseline.json")["settings"]
    _edit(directory, "baseline", settings={**settings, "optimizer": "adamaxw"})
    text = report(root, tmp_path / "report")
    titles = [
        line.split(" | ")[0]
        for line in text.splitlines()
        if line.startswith("| ") and "(`baseline`)" in line.split(" | ")[0]
    ]
    assert len(titles) == 4  # Tables 2 and 3, on the first page and in full
    for title in titles:
        assert "AdamaxW" in title and "AdamW" not in title, title
    assert "this run differs: optimizer adamaxw (the row stands for adamw)" in text
    assert "(ours ran as siamese concat(u, v), round-robin, AdamaxW, no SMART)" in _sections(text)["Summary"]


def test_a_choice_made_at_other_settings_than_the_runs_says_so(tmp_path):
    # The search records the settings each point ran at: the same as the tables' run of
    # the configuration, the report says so; one changed (here the epochs, as when the
    # scale changed after the search), it names what differs.
    root = _outputs(tmp_path, ["baseline", "best"])
    _ran_at(root, "best", 1e-4, 1e-3)
    ran = ran_at(read_run(MultitaskRunFile, root / "metrics" / "multitask" / "best.json"))
    recorded = {k: v for k, v in ran.items() if k not in SEARCH_VARIES}
    grids = {("best", "best", "adamaxw"): {1e-4: (0.4, 0.41, 0.39)}}
    _family_search(root, grids, {("best", "adamaxw"): ["best"]}, recorded)
    section = _sections(report(root, tmp_path / "same"))["What chose what"]
    assert _row(section, "| `cpu` | best | adamaxw |")[-2] == "the settings of the tables' run"
    elsewhere = recorded | {"epochs": recorded["epochs"] + 2}
    _family_search(root, grids, {("best", "adamaxw"): ["best"]}, elsewhere)
    section = _sections(report(root, tmp_path / "elsewhere"))["What chose what"]
    said = _row(section, "| `cpu` | best | adamaxw |")[-2]
    assert said == f"other settings: epochs {recorded['epochs'] + 2} (the run: {recorded['epochs']})"


def test_seeds_run_at_other_settings_than_the_tables_run_are_left_out_and_named(tmp_path):
    # As after `dvc exp run -S optimizer=adamaxw`: `baseline` now runs AdamaxW, while the
    # committed seed study's seeds of it ran AdamW (its recorded settings say so).
    root = _outputs(tmp_path, ["baseline", "siamese-diff"])
    directory = root / "metrics" / "multitask"
    recorded = {
        c: settings_digest(read_run(MultitaskRunFile, directory / f"{c}.json"))
        for c in ("baseline", "siamese-diff")
    }
    _write_seed_study(
        root, {"baseline": {1: 0.40, 2: 0.41, 3: 0.42}, "siamese-diff": {1: 0.5, 2: 0.52, 3: 0.5}}
    )
    study = json.loads((root / "metrics" / "seed-study.json").read_text())
    (root / "metrics" / "seed-study.json").write_text(json.dumps(study | {"settings": recorded}))
    before = _sections(report(root, tmp_path / "same"))["Seed study"]
    assert "Left out" not in before and "Not checked" not in before
    settings = read_result(directory / "baseline.json")["settings"]
    _edit(directory, "baseline", settings={**settings, "optimizer": "adamaxw"})
    text = report(root, tmp_path / "other")
    seeds = _sections(text)["Seed study"]
    assert "Left out: the extra seeds of `baseline`, whose runs had other settings" in seeds
    assert _row(seeds, "| `baseline` |")[COLUMNS.index("average") + 1].count("±") == 0  # its own seed alone
    # No verdict rests on them: `siamese-diff` vs `baseline` is not checked over seeds.
    table = _sections(text)["Table 3"]
    assert "**" not in _row(table, "(`siamese-diff`)")[-1]


# ----------------------------------------------------------------------------- one verdict

_SIGNED = r"([+-]\d\.\d{3}) \[([+-]\d\.\d{3,}), ([+-]\d\.\d{3,})\]"
_CELL = re.compile(rf"^(\*\*)?{_SIGNED}(\*\*)?(?: ([†‡]))?$")
_CLAUSE = re.compile(rf"^({'|'.join(COLUMN_TITLES.values())}) {_SIGNED}: ({'|'.join(VERDICTS)})\b")
_SAID_CELL = re.compile(rf"^{_SIGNED} \((one seed|\d+ seeds)\): ({'|'.join(VERDICTS)})$")
_DELTA_HEADER = re.compile(rf"^(GPU )?Δ ({'|'.join(COLUMN_TITLES.values())}|average) vs `([\w-]+)`$")
_MARKS = {("**", ""): SHOWN, ("", "†"): UNCONFIRMED, ("", "‡"): BUDGETS_DIFFER, ("", ""): WITHIN_NOISE}


def _excludes(low: str, high: str) -> bool:
    return float(low) > 0 or float(high) < 0


def verdicts_in(pages: dict[str, str]) -> tuple[dict[tuple, set[str]], list[str]]:
    """Every verdict the report's pages give a comparison, keyed by (scale, name, parent,
    column), read from the tables' marks, the sentences and the budget page's column; and
    every mark or verdict that contradicts its own interval."""
    found: dict[tuple, set[str]] = {}
    wrong: list[str] = []
    titles = {v: k for k, v in COLUMN_TITLES.items()} | {"average": AVERAGE}
    for page, text in pages.items():
        scale, header = ("gpu" if page == "gpu.md" else "cpu"), None
        for line in text.splitlines():
            if line.startswith("#"):
                scale = "gpu" if page == "gpu.md" or "GPU" in line else "cpu"
            if not line.startswith("|"):
                header = None
                for m in re.finditer(rf"(\*\*)?{_SIGNED}(\*\*)?(?: ([†‡]))", line):
                    if not _excludes(m[3], m[4]):
                        wrong.append(f"{page}: {m[0]} marked, its interval contains zero")
            sentence = re.match(r"- `([\w-]+)` vs `([\w-]+)`: ", line)
            if sentence:
                name, parent = sentence.groups()
                for clause in line.split(": ", 1)[1].split("; "):
                    m = _CLAUSE.match(clause)
                    if m:
                        found.setdefault((scale, name, parent, titles[m[1]]), set()).add(m[5])
                        if (m[5] == WITHIN_NOISE) == _excludes(m[3], m[4]):
                            wrong.append(f"{page}: {clause}")
            for m in re.finditer(rf"\(`([\w-]+)` vs `([\w-]+)`, ({'|'.join(VERDICTS)})\)", line):
                found.setdefault((scale, m[1], m[2], AVERAGE), set()).add(m[3])
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if header is None:
                header = cells
                continue
            if set(line) <= set("|-"):
                continue
            names = re.findall(r"`([\w-]+)`", cells[0])
            for title, cell in zip(header, cells):
                h = _DELTA_HEADER.match(title)
                said = _SAID_CELL.match(cell)
                if h and names and said:  # the first page's: an interval, its seeds, the verdict
                    key = ("gpu" if h[1] or scale == "gpu" else "cpu", names[-1], h[3], titles[h[2]])
                    found.setdefault(key, set()).add(said[5])
                    if said[5] == SHOWN and not _excludes(said[2], said[3]):
                        wrong.append(f"{page}: {cells[0]} {title}: {cell}")
                    if said[4] == "one seed" and (said[5] == WITHIN_NOISE) == _excludes(said[2], said[3]):
                        wrong.append(f"{page}: {cells[0]} {title}: {cell}")
                m = _CELL.match(cell)
                if m is None:
                    continue
                mark = _MARKS.get((m[1] or "", m[6] or ""))
                # A mark on an interval that contains zero; no mark where a difference from
                # a parent (a verdict's column) excludes it.
                verdicts = bool(re.match(r"^(GPU )?Δ .*(vs `|full − last layer)", title))
                if (
                    mark is None
                    or (mark != WITHIN_NOISE or verdicts)
                    and (mark == WITHIN_NOISE) == _excludes(m[3], m[4])
                ):
                    wrong.append(f"{page}: {cells[0]} {title}: {cell}")
                h = _DELTA_HEADER.match(title)
                if h and names:
                    key = ("gpu" if h[1] or scale == "gpu" else "cpu", names[-1], h[3], titles[h[2]])
                    found.setdefault(key, set()).add(mark)
            if "Verdict" in header and len(names) == 2:
                verdict = cells[header.index("Verdict")]
                found.setdefault((scale, names[0], names[1], AVERAGE), set()).add(verdict)
    return found, wrong


def _pages(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(Path(directory).glob("*.md"))}


def _one_verdict_each(directory: Path) -> dict[tuple, set[str]]:
    found, wrong = verdicts_in(_pages(directory))
    assert not wrong, wrong
    two = {key: said for key, said in found.items() if len(said) > 1}
    assert not two, two
    for name, text in _pages(directory).items():
        assert not re.search(r"\bdistinguishable\b|\bmeasurable\b", text)  # the old verdicts' words
        assert not table_shapes(text), name  # every row of a table has its header's cells
    return found


def test_every_page_gives_each_comparison_one_verdict_that_its_marks_agree_with(tmp_path):
    root = _studied(tmp_path)
    report(root, tmp_path / "r")
    found = _one_verdict_each(tmp_path / "r")
    # Each comparison is read in the tables, the summary, the seed study and the budget page.
    assert len(found[("cpu", "best-summed", "best", AVERAGE)]) == 1
    pages = _pages(tmp_path / "r")
    assert sum("`best-summed` vs `best`" in text for text in pages.values()) >= 3
    # A verdict changed in one place only is caught, and so is a mark its interval denies.
    said = re.search(r": (within dev noise|not confirmed by the seeds|budgets differ) \(", pages["seeds.md"])[
        1
    ]
    changed = {**pages, "seeds.md": pages["seeds.md"].replace(f": {said} (", ": shown (", 1)}
    assert any(len(v) > 1 for v in verdicts_in(changed)[0].values())
    unmarked = {**pages, "tables.md": re.sub(r"(\d\]) [†‡]", r"\1", pages["tables.md"], count=1)}
    assert verdicts_in(unmarked)[1]
    bold = {**pages, "tables.md": pages["tables.md"].replace("| +0.000 [-", "| **+0.000 [-", 1)}
    assert bold == pages or verdicts_in(bold)[1]


def test_the_committed_report_gives_each_comparison_one_verdict_on_a_first_page_of_15_kb():
    directory = REPO / "report"
    found = _one_verdict_each(directory)
    assert ("cpu", "siamese-diff", "baseline", AVERAGE) in found
    first = (directory / "README.md").read_text(encoding="utf-8")
    assert len(first.encode()) <= 15_000, len(first.encode())
    table2 = next(i for i, line in enumerate(first.splitlines()) if line.startswith("## Table 2"))
    assert table2 < 60, table2


def test_a_decay_a_one_epoch_run_never_applies_says_so():
    from minbert.report.notes import rates

    s = {"optimizer": "adamaxw", "lr": 3e-4, "head_lr": 1e-3, "lr_schedule": "exponential", "lr_gamma": 0.9}
    assert (
        rates(SimpleNamespace(**s, epochs=1))
        == "adamaxw lr 0.0003 (heads 0.001), × 0.9 per epoch (never applied: one epoch)"
    )
    assert rates(SimpleNamespace(**s, epochs=3)) == "adamaxw lr 0.0003 (heads 0.001), × 0.9 per epoch"
    per_step = {**s, "lr_schedule": "exponential-per-step"}
    assert (
        rates(SimpleNamespace(**per_step, epochs=1))
        == "adamaxw lr 0.0003 (heads 0.001), × 0.9 per epoch, a fraction every step"
    )


def test_each_table1_arm_says_how_validation_stood_at_its_end(tmp_path):
    from minbert.report.tables import (
        ENDED_WITHIN_NOISE,
        STILL_IMPROVING,
        STOPPED_AT_BEST,
        STOPPED_BEYOND_NOISE,
        STOPPED_WITHIN_NOISE,
        validation_end,
    )

    def ended(mccs: list[float], epochs: int, n: int = 100) -> str:
        path = tmp_path / "history.csv"
        pd.DataFrame({"epoch": range(len(mccs)), "val_mcc": mccs}).to_csv(path, index=False)
        run = SimpleNamespace(epochs=epochs, epochs_run=len(mccs) - 1, validation_examples=n)
        return validation_end(run, path)

    # Noise on 100 examples at MCC 0.63: √((1 − 0.63²) / 98) ≈ 0.078; epoch 3 rises 0.17.
    kind, said = ended([0.0, 0.40, 0.63, 0.80], epochs=3)
    assert kind == STILL_IMPROVING and "at epoch 3 (0.8000, noise ±0.061, 100 examples)" in said
    assert ended([0.0, 0.78, 0.80], epochs=2)[0] == ENDED_WITHIN_NOISE
    kind, said = ended([0.0, 0.27, 0.2693], epochs=3)  # patience on a wobble
    assert kind == STOPPED_WITHIN_NOISE and "at epoch 1 (0.2700" in said and "ended -0.0007 on it" in said
    assert ended([0.0, 0.6, 0.3], epochs=3)[0] == STOPPED_BEYOND_NOISE
    # Stopped while its last epoch is its best: a rise the split cannot tell, not a plateau.
    kind, said = ended([0.0, 0.50, 0.48, 0.52], epochs=5)
    assert kind == STOPPED_AT_BEST and "at epoch 1 (0.5000" in said and "ended +0.0200 on it" in said
    # The stage's rule: small rises that add up past the noise are a gain (0.70 -> 0.80).
    assert ended([0.0, 0.70, 0.75, 0.80], epochs=3)[0] == STILL_IMPROVING
    assert ended([0.0, 0.70, 0.75, 0.76], epochs=3)[0] == ENDED_WITHIN_NOISE
    # The larger the validation split, the smaller the change it can tell from noise.
    assert ended([0.0, 0.70, 0.75], epochs=2, n=100)[0] == ENDED_WITHIN_NOISE
    assert ended([0.0, 0.70, 0.75], epochs=2, n=10_000)[0] == STILL_IMPROVING


def test_the_report_words_an_arms_end_by_the_stages_own_rule(tmp_path):
    """The report replays the stage's plateau rule on the history it wrote: the epoch it
    names as the last gain is the one ``BestEpoch`` counted patience from."""
    import re

    import numpy as np

    from minbert.metrics import correlation_noise
    from minbert.report.tables import validation_end
    from minbert.train.loop import BestEpoch

    rng, path, n = np.random.default_rng(0), tmp_path / "history.csv", 300
    for _ in range(100):
        scores = np.round(np.cumsum(rng.normal(0.03, 0.06, size=7)), 4).tolist()
        best = BestEpoch()
        for epoch, score in enumerate(scores):
            best.offer(epoch, score, dict, lambda reference: correlation_noise(reference, n))
        pd.DataFrame({"epoch": range(len(scores)), "val_mcc": scores}).to_csv(path, index=False)
        run = SimpleNamespace(epochs=6, epochs_run=6, validation_examples=n)
        named = int(re.search(r"at epoch (\d+)", validation_end(run, path)[1]).group(1))
        assert named == best.gained


def test_no_committed_row_claims_a_schedule_that_did_not_act():
    """Each committed multitask run's rates as the report words them (the cpu and the gpu
    study), against the learning rates its record says were applied at each epoch's first
    and last optimizer step (a run recorded before those were, the GPU study's: its
    history's rate per epoch, which a per-epoch schedule holds through the epoch): a decay
    that never changed the rate says so, and a decay stepped per step ends where it says."""
    for directory in (REPO / "metrics" / "multitask", REPO / "metrics" / "gpu" / "metrics" / "multitask"):
        for run in read_runs(MultitaskRunFile, directory):
            per_epoch = list(pd.read_csv(directory / f"{run.config}-history.csv")["lr"].dropna())
            if run.applied_lr is None:
                assert run.settings.lr_schedule != "exponential-per-step", run.config
                applied = [(lr, lr) for lr in per_epoch]
            else:
                applied = [(a.first_step, a.last_step) for a in run.applied_lr]
                assert [first for first, _ in applied] == pytest.approx(per_epoch), run.config
            _said_as_applied(run, applied)


def _said_as_applied(run: MultitaskRunFile, applied: list[tuple[float, float]]) -> None:
    from minbert.report.notes import rates

    s, said = run.settings, rates(run.settings)
    decays = s.lr_schedule.startswith("exponential")
    acted = len({lr for pair in applied for lr in pair}) > 1
    assert ("per epoch" in said) == decays, (run.config, said)
    assert ("never applied" in said) == (decays and not acted), (run.config, said, applied)
    assert acted == decays, (run.config, s.lr_schedule, applied)
    assert applied[0][0] == pytest.approx(s.lr), run.config
    if s.lr_schedule == "exponential-per-step":  # the run's last step one step short of lr_gamma^epochs
        assert applied[-1][1] == pytest.approx(s.lr * s.lr_gamma ** len(applied), rel=1e-2), run.config


def test_changed_files_are_named_with_their_folder_where_two_share_a_name():
    from minbert.gpu_study import named_files

    files = [f"src/minbert/{f}" for f in ("evaluate/zero_shot.py", "metrics.py", "pipeline/zero_shot.py")]
    assert named_files(files) == "`evaluate/zero_shot.py`, `metrics.py`, `pipeline/zero_shot.py`"
    assert named_files(files, at_most=1) == "`evaluate/zero_shot.py` and 2 more"


def test_fine_tuning_against_the_untrained_checkpoint_is_said_over_the_seeds_it_was_fitted_with(tmp_path):
    """With the checkpoint's probes fitted with the study's seeds, each configuration's
    average minus the checkpoint's with the same seed, over the seeds: `baseline` lower
    with every seed, `best` and `best-no-smart` higher, `best-summed` scattered across it;
    the tables' seed's own dev intervals are said as that seed's."""
    root = _studied(tmp_path)
    write_zero_shot(root)
    _edit(root / "metrics", "zero-shot", seed=99)  # fitted with a seed no configuration ran with
    study = json.loads((root / "metrics" / "seed-study.json").read_text())
    study["configs"]["zero-shot"] = _seed_rows({1: 0.45, 2: 0.46, 3: 0.44})
    (root / "metrics" / "seed-study.json").write_text(json.dumps(study))
    text = report(root, tmp_path / "r")
    findings = _sections(text)["Findings"]
    assert (
        "the fine-tuned average is lower in 1 (`baseline`) and higher in 2 (`best-no-smart`, "
        "`best`) (not separated: `best-summed` +0.053 [" in findings
    )
    assert "the mean over its 4 seeds" in findings and "with the tables' seed" in findings
    over = {c: _row(findings, f"| `{c}` |")[-1] for c in STUDIED}
    assert over["baseline"] == "-0.050 [-0.050, -0.050]"
    assert not _excludes_zero(over["best-summed"])
    summary = _sections(text)["Summary"]
    assert "Over the seeds, each configuration's average minus the untrained checkpoint's" in summary
    # Table 2's untrained row: the mean over the seeds it was fitted with, as every row.
    zero = _row(
        _sections((tmp_path / "r" / "README.md").read_text(encoding="utf-8"))["Table 2"], "(`zero-shot`)"
    )
    own = read_result(root / "metrics" / "zero-shot.json")["average"]
    assert zero[4] == f"{statistics.mean([0.45, 0.46, 0.44, own]):.3f}" and zero[5] == "4"


def test_without_the_checkpoint_in_the_seed_study_the_comparison_is_the_tables_seeds_alone(tmp_path):
    root = _studied(tmp_path)
    write_zero_shot(root)
    findings = _sections(report(root, tmp_path / "r"))["Findings"]
    assert "the seed study has not fitted the checkpoint's probes with its seeds" in findings
    assert "over seeds" not in findings.split("Each configuration minus the untrained checkpoint")[1]


def test_development_seed_names_only_a_choice_made_with_the_tables_seed():
    from minbert.report.first_page import development_seed
    from minbert.report.studies import choice_seeds

    runs = {"best": SimpleNamespace(seed=11711, scores={AVERAGE: 0.6})}
    searched = {"lr-search.json": {101, 102, 103}}
    text = development_seed(runs, None, choice_seeds({**searched, "collapse.json": {11711}}))
    assert text == (
        "The tables' runs use seed 11711, the seed the choices of `collapse.json` were made with: "
        "theirs are the development seed's numbers."
    )
    # Choices over other seeds than the tables' leave its numbers no development seed's.
    assert development_seed(runs, None, choice_seeds({**searched, "collapse.json": {101, 102}})) == (
        "The tables' runs use seed 11711."
    )


def test_the_development_seeds_lead_is_set_beside_every_other_seeds():
    """The tables' seed against the others' mean, and each other seed against the rest the
    same way: the control that says whether its lead is its own."""
    from minbert.report.first_page import development_seed
    from minbert.report.studies import choice_seeds

    runs = {
        "best": SimpleNamespace(seed=11711, scores={AVERAGE: 0.60}),
        "baseline": SimpleNamespace(seed=11711, scores={AVERAGE: 0.40}),
    }
    rows = {
        "best": [SimpleNamespace(seed=s, scores={AVERAGE: v}) for s, v in ((1, 0.58), (2, 0.56))],
        "baseline": [SimpleNamespace(seed=s, scores={AVERAGE: v}) for s, v in ((1, 0.41), (2, 0.36))],
    }
    text = development_seed(runs, SimpleNamespace(configs=rows), choice_seeds({}))
    # 11711: best +0.03, baseline +0.015; seed 1: best 0.0, baseline +0.03; seed 2: -0.03, -0.045.
    assert "above the other seeds' mean in 2 of 2 configurations (+0.022 on average)" in text
    assert "each other seed against the rest, the same way: 1 +0.015, 2 -0.037" in text


def test_the_collapse_control_is_checked_against_the_norm_search_at_its_norm(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from minbert.report.smart_page import control_repeats
    from minbert.runs.study_files import read_smart_measurement, read_smart_norm_search

    root = _outputs(tmp_path, ["baseline", "best"])
    best = {m.config: m for m in load_runs(root / "metrics" / "multitask")}["best"]
    used = best.settings.smart.token_norm
    kept = {"the runs' settings": [0.50, 0.52, 0.51], "token_norm 1 (the authors' code)": [0.4, 0.4, 0.4]}
    collapse = read_smart_measurement(_collapse_file(tmp_path / "collapse.json", best, kept))
    scores = {used: [0.50, 0.52, 0.51], 0.1: [0.40, 0.45, 0.41]}
    search = read_smart_norm_search(_norm_search(tmp_path / "norm.json", best, scores, chosen=used))
    assert control_repeats(collapse, search) == (
        f"The control repeats the norm search's runs at token_norm {used:g} with seeds 101, 102, 103: "
        "the same validation score to four decimals with each."
    )
    scores[used][1] = 0.5301
    search = read_smart_norm_search(_norm_search(tmp_path / "norm.json", best, scores, chosen=used))
    assert "does not repeat" in control_repeats(collapse, search)
    assert "seed 102 0.5200 against 0.5301" in control_repeats(collapse, search)
    # Runs at other settings are not expected to repeat: nothing is said.
    values = json.loads((tmp_path / "norm.json").read_text())
    values["results"]["ran_at"]["lr"] = 1.0
    (tmp_path / "norm.json").write_text(json.dumps(values))
    assert control_repeats(collapse, read_smart_norm_search(tmp_path / "norm.json")) == ""


def test_a_start_that_answers_as_the_untrained_checkpoint_is_its_own_start(tmp_path):
    # The cosine STS head fits nothing: its start is the untrained cosine on another 0-5
    # mapping, each written to 3 decimals; the untrained number is then the run's own start.
    import numpy as np

    from minbert.report.evidence import Evidence, Scored
    from minbert.tasks import AVERAGE

    rng = np.random.default_rng(0)
    cosines = rng.uniform(-0.2, 1.0, 500)
    labels = {"sst": rng.integers(0, 5, 500), "sts": rng.uniform(0, 5, 500)}
    classes = rng.integers(0, 5, 500)

    def scored(sst, sts) -> Scored:
        return Scored("run", labels, {"sst": sst, "sts": sts})

    untrained = scored(classes, np.round(2.5 * (cosines + 1), 3))
    start = scored(classes.copy(), np.round(5 * cosines, 3))
    evidence = Evidence(tmp_path, tmp_path)
    assert evidence.same_answers(start, untrained, "sts") and evidence.same_answers(start, untrained, "sst")
    assert evidence.same_answers(start, untrained, AVERAGE)
    fitted = scored(classes, np.round(5 * cosines + rng.normal(0, 0.05, 500), 3))  # a head moved it
    assert not evidence.same_answers(fitted, untrained, "sts")
    other = classes.copy()
    other[0] = (other[0] + 1) % 5
    assert not evidence.same_answers(scored(other, start.predictions["sts"]), untrained, "sst")
    assert not evidence.same_answers(scored(other, start.predictions["sts"]), untrained, AVERAGE)


def test_the_benchmarks_that_chose_sizes_are_named_where_they_ran_with_the_tables_seed(tmp_path, capsys):
    """The report stage's --size-choices: each result's seed is read, and a result made
    with the tables' seed is named on the first page; a missing one is an error naming it."""
    from minbert.pipeline.report import main

    root = _outputs(tmp_path, ["baseline", "best"])
    chose = tmp_path / "sst_rows_baseline.json"
    chose.write_text(json.dumps({"args": {"seed": 11711}, "results": {}}))
    other = tmp_path / "learning_curve_best.json"
    other.write_text(json.dumps({"args": {"seed": 7}, "results": {}}))
    given = [
        *("--metrics", root / "metrics", "--predictions", root / "predictions"),
        *("--prepared", root / "prepared", "--paper", PAPER, "--out", tmp_path / "out"),
    ]
    main([*map(str, given), "--sources", str(root), "--size-choices", str(chose), str(other)])
    first = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert f"the seed the choices of `{chose.as_posix()}` were made with" in first
    assert "learning_curve_best.json" not in first
    with pytest.raises(SystemExit):
        main([*map(str, given), "--size-choices", str(tmp_path / "absent.json")])
    assert "absent.json: no such benchmark result" in capsys.readouterr().err


def test_the_seed_page_says_where_each_seeds_runs_were_made_or_that_it_was_not_recorded():
    from minbert.report.studies import _made_where
    from minbert.runs.study_files import SeedRun, SeedStudyFile

    def run(seed, code="", device=""):
        return SeedRun(seed, f"exp-{seed}", {"average": 0.5}, code, device)

    study = SeedStudyFile(
        "minbert seed-study", "queues", [1, 2], {"a": [run(1, "b64006e", "cpu (2 threads)"), run(2)]}
    )
    assert _made_where(study) == (
        "Where the seeds' runs were made (the code's commit, the device): seed 1 at commit b64006e on "
        "cpu (2 threads); not recorded for seed 2 (the study was written before it recorded them; the git "
        "log of `metrics/seed-study.json` dates each seed's rows)."
    )
