"""The head warm-up's pass cap as the report reads it (``bench/warmup_cap.py``'s result):
stated only where it reproduces the runs' own warm-ups, and the runs whose validation lead
over their start is no more than the longer cap moves that start."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_report import write_labels, write_multitask

from minbert.pipeline.entry import paths
from minbert.report.counted_runs import load_runs
from minbert.report.warmup_cap import warmup_cap_section
from minbert.runs.record_parts import WarmupKept
from minbert.runs.study_files import read_warmup_cap
from minbert.tasks import MULTITASK_TASKS

CAP, LONGER = 30, 300


def _runs(root: Path) -> dict:
    """Two runs of one epoch (validation selection 0.10 at the start, 0.15 at epoch 1: a lead
    of +0.05), each with its heads fitted at the cap: `baseline`'s SST head kept its last pass."""
    write_labels(root)
    write_multitask(root, ["baseline", "concatenation"], epochs=1)
    runs = {}
    for m in load_runs(root / "metrics" / "multitask"):
        warmup = dataclasses.replace(m.settings.head_warmup, epochs=CAP)
        fits = {t: WarmupKept(rows=480, epochs_kept=CAP if t == "sst" else 12, validation_loss_before=1.0,
                              validation_loss_after=0.8) for t in MULTITASK_TASKS}  # fmt: skip
        runs[m.config] = dataclasses.replace(
            m, settings=dataclasses.replace(m.settings, head_warmup=warmup), head_warmup=fits
        )
    return runs


def _fit(kept: dict[str, int], selection: float) -> dict:
    warmup = {t: {"rows": 480, "epochs_kept": k, "validation_loss_before": 1.0, "validation_loss_after": 0.8}
              for t, k in kept.items()}  # fmt: skip
    seconds = 2.0 if max(kept.values()) > CAP else 1.0
    return {"warmup": warmup, "warmup_seconds": seconds, "validation": {"selection": selection}}


def _study(path: Path, runs: dict, changes: dict[str, float]) -> Path:
    """A result whose committed-cap fits at the runs' seed are the runs' own, each start's
    selection moved by ``changes[config]`` at the longer cap; another seed beside."""
    starts = []
    for config, change in changes.items():
        for seed in (runs[config].seed, 1):
            mine = {t: w.epochs_kept for t, w in runs[config].head_warmup.items()}
            fits = {str(CAP): _fit(mine, 0.1), str(LONGER): _fit({**mine, "sst": 41}, 0.1 + change)}
            starts.append({"configs": [config], "seed": seed, "fits": fits, "selection_change": change})
    results = {"committed_cap": CAP, "cap": LONGER, "seeds": [runs["baseline"].seed, 1], "starts": starts,
               "problems": []}  # fmt: skip
    path.write_text(json.dumps({"started": "2026-11-29T18:46:54+00:00", "results": results}))
    return path


def test_the_section_measures_the_cap_and_names_the_runs_it_could_overturn(tmp_path):
    runs = _runs(tmp_path)
    file = _study(tmp_path / "cap.json", runs, {"baseline": 0.01, "concatenation": 0.06})
    text = "\n".join(warmup_cap_section(file, runs, tmp_path / "metrics" / "multitask"))
    assert "at the runs' cap of 30 passes and at 300, with seeds 11711, 1" in text
    assert (
        "At 30 passes 4 of the 12 fits keep their last allowed pass; at 300, 0 do (the latest pass kept: 41)"
        in text
    )
    assert "the warm-up's time from 1 to 2 seconds a start (median)" in text
    assert (
        "| `baseline` | 30 / 41; 12 / 12; 12 / 12 | 0.1000 | 0.1100 | +0.0100 (+0.0100 to +0.0100) |" in text
    )
    # concatenation leads its start by +0.05 on validation; the longer cap moves that start by +0.06.
    assert "1 of the 2 runs lead their start on validation" in text
    assert "`concatenation` +0.0500 against +0.0600" in text and "`baseline` +0.05" not in text
    file = _study(tmp_path / "cap.json", runs, {"baseline": 0.01, "concatenation": 0.02})
    text = "\n".join(warmup_cap_section(file, runs, tmp_path / "metrics" / "multitask"))
    assert "every run leads its start on validation by more than the longer cap moves that start" in text


def test_a_measurement_that_does_not_give_back_the_runs_warm_ups_is_not_stated(tmp_path):
    runs = _runs(tmp_path)
    file = _study(tmp_path / "cap.json", runs, {"baseline": 0.01, "concatenation": 0.06})
    values = json.loads(file.read_text())
    values["results"]["starts"][0]["fits"][str(CAP)]["warmup"]["sst"]["epochs_kept"] = 29
    file.write_text(json.dumps(values))
    text = "\n".join(warmup_cap_section(file, runs, tmp_path / "metrics" / "multitask"))
    assert (
        "was measured at other settings than the runs': `baseline`'s SST head kept pass 30 "
        "(validation loss 0.8), here 29 (0.8)" in text
    )
    assert "runs lead their start" not in text
    # A run the measurement left out, and the bench's own control failing, are named the same way.
    file = _study(tmp_path / "cap.json", runs, {"baseline": 0.01})
    text = "\n".join(warmup_cap_section(file, runs, tmp_path / "metrics" / "multitask"))
    assert "`concatenation` at seed 11711 was not measured" in text
    values = json.loads(_study(file, runs, {"baseline": 0.01, "concatenation": 0.0}).read_text())
    values["results"]["problems"] = ["baseline: start's validation selection 0.2 here, 0.1 in its history"]
    file.write_text(json.dumps(values))
    text = "\n".join(warmup_cap_section(file, runs, tmp_path / "metrics" / "multitask"))
    assert "other settings than the runs': baseline: start's validation selection 0.2 here" in text
    assert "No measurement of the warm-up's cap" in "\n".join(warmup_cap_section(None, runs, tmp_path))
    values["results"].pop("problems")
    file.write_text(json.dumps(values))
    with pytest.raises(ValueError, match="lacks problems: written by an older `python bench/warmup_cap.py`"):
        read_warmup_cap(file)


def test_a_stage_option_can_take_several_paths():
    given = paths(["--out", "o", "--many", "a", "b"], "out", optional=("one",), several=("many", "none"))
    assert given == {"out": Path("o"), "one": None, "many": [Path("a"), Path("b")], "none": []}
