"""The runs `dvc repro` leaves out (params.yaml's `repro_configs`; `minbert extra-runs`):
the committed ones are current, and the report counts one only while the files its stage
read are unchanged."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO

from minbert.data.predictions import write_predictions
from minbert.metrics import fixed, score
from minbert.report.counted_runs import mlm_runs
from minbert.report.evidence import Evidence
from minbert.report.outside_repro import extra_runs
from minbert.report.pretraining import MLM_PROVENANCE, MLM_STUDY_DIR, mlm_section
from minbert.runs.study_files import EXTRA_RUNS_FILE, read_extra_runs, read_mlm_study
from minbert.runs.training import MultitaskRunFile, read_runs
from minbert.tasks import MULTITASK_TASKS
from minbert.tools.extra_runs import PREDICTIONS, RUN_FILES, left_out

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_every_left_out_configuration_has_a_current_committed_run():
    """Each configuration `dvc repro` skips has its files and a recorded stage whose every
    dependency (code, settings, data folders) has the hash the current dvc.lock gives that
    path, or the file's own where no stage of the lock names it: not a stale run."""
    configs = left_out(PARAMS)
    assert configs == ["best-summed", "best-round-robin-equal"]
    record = read_extra_runs(REPO / "metrics" / EXTRA_RUNS_FILE)
    assert record is not None and sorted(record.stages) == sorted(f"multitask@{c}" for c in configs)
    known = _known()
    for config in configs:
        for suffix in RUN_FILES:
            assert (REPO / "metrics" / "multitask" / f"{config}{suffix}").is_file(), (config, suffix)
        for task in MULTITASK_TASKS:
            for split in PREDICTIONS:
                folder = REPO / "metrics" / "extra-runs" / "predictions" / "multitask" / config
                assert (folder / f"{task}-{split}-out.csv").is_file(), (config, task, split)
        deps = record.stages[f"multitask@{config}"]["deps"]
        assert {d["path"] for d in deps} >= {"data/features", "data/tokenized", "src/minbert/train/smart.py"}
        assert _changed(deps, known) == [], f"{config}: changed since it ran; rerun `minbert extra-runs`"


def _changed(deps: list[dict], known: dict[str, str]) -> list[str]:
    """The deps whose hash is not the current dvc.lock's for that path (``known``), or the
    file's own where no stage of the lock names it."""
    changed = []
    for dep in deps:
        # A settings file is in no clone (data/ is DVC's): the report checks it where it is.
        path = REPO / dep["path"]
        if dep["md5"] != (known.get(dep["path"]) or (_md5(path) if path.is_file() else dep["md5"])):
            changed.append(dep["path"])
    return changed


def _known() -> dict[str, str]:
    """Every path's hash in the current dvc.lock's stages (not an entry it may still hold for
    a stage dvc.yaml no longer has: that would agree with a record whatever changed since)."""
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:  # the stages dvc.yaml defines now, as DVC expands them
        staged = {stage.addressing for stage in repo.index.stages}
    lock = yaml.safe_load((REPO / "dvc.lock").read_text(encoding="utf-8"))["stages"]
    return {
        d["path"]: d["md5"]
        for name, stage in lock.items()
        if name in staged
        for d in [*stage.get("deps", []), *stage.get("outs", [])]
    }


def test_the_committed_mlm_study_is_current():
    """`minbert mlm-study`'s stages read what the pipeline gives now (code, data folders):
    code that changes them fails here until the study is rerun."""
    record = read_mlm_study(REPO / "metrics" / MLM_STUDY_DIR / MLM_PROVENANCE)
    assert record is not None and sorted(record.stages) == ["mlm@continue", "multitask-mlm@continue-baseline"]
    known = _known()
    for name, entry in record.stages.items():
        read = {d["path"] for d in entry["deps"]}
        assert read >= {
            "data/tokenized",
            "src/minbert/train/mlm.py" if name.startswith("mlm@") else "src/minbert/train/multitask.py",
        }, name
        rerun = f"{name}: changed since it ran; rerun `minbert mlm-study`"
        assert _changed(entry["deps"], known) == [], rerun


def test_an_mlm_study_counts_only_while_what_it_read_is_unchanged(tmp_path):
    metrics = tmp_path / "metrics"
    shutil.copytree(REPO / "metrics" / MLM_STUDY_DIR, metrics / MLM_STUDY_DIR)
    study = json.loads((metrics / MLM_STUDY_DIR / MLM_PROVENANCE).read_text(encoding="utf-8"))
    for entry in study["stages"].values():  # files made here, with their hashes
        for dep in (d for d in entry["deps"] if not d["md5"].endswith(".dir")):
            made = tmp_path / dep["path"]
            made.parent.mkdir(parents=True, exist_ok=True)
            made.write_text(f"what {dep['path']} held\n")
            dep["md5"] = _md5(made)
    (metrics / MLM_STUDY_DIR / MLM_PROVENANCE).write_text(json.dumps(study))
    counted = mlm_runs(metrics, tmp_path)
    assert counted.refused is None and set(counted.pretraining) == {"continue"} and counted.tuned
    (tmp_path / "src" / "minbert" / "train" / "mlm.py").write_text("changed\n")
    refused = mlm_runs(metrics, tmp_path)
    assert not refused.pretraining and not refused.tuned
    assert refused.refused == "`mlm.py` changed since it ran"
    said = mlm_section(refused, {}, Evidence(tmp_path / "predictions", tmp_path / "prepared"))
    assert "is not counted: `mlm.py` changed since it ran" in said and "Rerun `minbert mlm-study`" in said
    # A study that did not record its stages (an older one) does not count either.
    study["stages"] = {}
    (metrics / MLM_STUDY_DIR / MLM_PROVENANCE).write_text(json.dumps(study))
    assert "not recorded" in mlm_runs(metrics, tmp_path).refused


def _study(tmp_path: Path) -> tuple[Path, list[MultitaskRunFile]]:
    """A copy of the committed runs, and a record of their stages whose file deps are files
    made here (a fresh clone has no data/settings), with those files' hashes."""
    metrics = tmp_path / "metrics"
    shutil.copytree(REPO / "metrics" / "multitask", metrics / "multitask")
    record = json.loads((REPO / "metrics" / EXTRA_RUNS_FILE).read_text(encoding="utf-8"))
    for entry in record["stages"].values():
        for dep in entry["deps"]:
            if not dep["md5"].endswith(".dir"):
                made = tmp_path / dep["path"]
                made.parent.mkdir(parents=True, exist_ok=True)
                made.write_text(f"what {dep['path']} held\n")
                dep["md5"] = _md5(made)
    (metrics / EXTRA_RUNS_FILE).write_text(json.dumps(record))
    return metrics, read_runs(MultitaskRunFile, metrics / "multitask")


def test_a_left_out_run_counts_only_while_what_it_read_is_unchanged(tmp_path):
    metrics, runs = _study(tmp_path)
    found = extra_runs(runs, PARAMS, metrics, tmp_path)
    assert found.kept == ["best-round-robin-equal", "best-summed"] and not found.refused
    assert set(found.counted) == {m.config for m in runs}
    # Its settings file changed (as `dvc exp run -S` would change it): not counted, and why.
    (tmp_path / "data" / "settings" / "multitask" / "best-summed.json").write_text("{}")
    found = extra_runs(runs, PARAMS, metrics, tmp_path)
    assert found.kept == ["best-round-robin-equal"] and "best-summed" not in found.counted
    assert "`best-summed.json` changed since it ran" in found.refused["best-summed"]
    assert "Not counted" in found.notes()["best-summed"] and "extra-runs" in "\n".join(found.lines())
    # A configuration `dvc repro` runs needs no record; one it leaves out does.
    everything = {**PARAMS, "repro_configs": list(PARAMS["configs"])}
    assert extra_runs(runs, everything, metrics, tmp_path).refused == {}
    (metrics / EXTRA_RUNS_FILE).unlink()
    found = extra_runs(runs, PARAMS, metrics, tmp_path)
    assert set(found.refused) == {"best-summed", "best-round-robin-equal"}


def test_the_evidence_reads_a_folder_moved_elsewhere_in_its_place(tmp_path):
    prepared, moved = tmp_path / "prepared", tmp_path / "moved" / "best-summed"
    prepared.mkdir()
    labels = [0, 1, 2, 3, 4, 1]
    ids = [f"s{i}" for i in range(len(labels))]
    pd.DataFrame({"id": ids, "label": labels}).to_parquet(prepared / "sst-dev.parquet")
    predicted = [0, 1, 2, 3, 1, 1]
    write_predictions(moved / "sst-dev-out.csv", "sst", ids, predicted)
    value = fixed(score("sst", np.array(labels, float), np.array(predicted, float)))
    files, numbers = {"sst": "multitask/best-summed/sst-dev-out.csv"}, {"sst": value}
    with pytest.raises(FileNotFoundError, match="dev predictions of multitask/best-summed are missing"):
        Evidence(tmp_path / "predictions", prepared).scored("multitask/best-summed", files, numbers)
    evidence = Evidence(tmp_path / "predictions", prepared, elsewhere={"multitask/best-summed": moved})
    scored = evidence.scored("multitask/best-summed", files, numbers)
    assert scored.predictions["sst"].tolist() == predicted


def test_the_first_page_marks_each_row_dvc_repro_does_not_run():
    """Its compact Table 4 shows such a row beside the pipeline's: a reader of that page
    alone is told which rows came from `minbert extra-runs`, under the table they are in."""
    page = (REPO / "report" / "README.md").read_text(encoding="utf-8")
    for config in left_out(PARAMS):
        row = next(line for line in page.splitlines() if line.startswith("|") and f"(`{config}`)" in line)
        mark = row.split(f"(`{config}`)")[1].split("|")[0].strip()
        assert mark.startswith("[") and mark.endswith("]"), (config, row)
        assert f"\n- {mark} `{config}`: Run by `minbert extra-runs`, outside `dvc repro`" in page, config
