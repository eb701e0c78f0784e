# ruff: noqa: F811  (the fixtures imported from test_multitask are parameters here)
"""`minbert lr-search`: every configuration on one grid, each its own best point by the
chance-corrected validation score, never a dev table."""

from __future__ import annotations

import json

import pytest
import yaml
from test_multitask import tiny_params, tokenized  # noqa: F401  (fixtures)

from minbert.tools.lr_search import SCORE, chosen, lr_search


def point(config, lr, score, optimizer="adamw"):
    return {"scale": "cpu", "config": config, "optimizer": optimizer, "lr": lr, "head_lr": 1e-3, SCORE: score}


def test_each_configuration_gets_its_own_best_point_and_a_tie_keeps_the_gentler_rate():
    runs = [
        point("baseline", 1e-4, 0.30),
        point("baseline", 1e-5, 0.31),
        point("best", 1e-5, 0.40, "adamaxw"),
        point("best", 3e-5, 0.40, "adamaxw"),  # a tie: the smaller rate stays
        point("best", 1e-4, 0.20, "adamaxw"),
    ]
    best = chosen(runs)
    assert set(best) == {"cpu/baseline/adamw", "cpu/best/adamaxw"}
    assert best["cpu/baseline/adamw"]["lr"] == 1e-5 and best["cpu/best/adamaxw"]["lr"] == 1e-5


@pytest.mark.slow
def test_a_search_trains_every_configuration_on_the_grid_without_dev(tmp_path, tokenized, tiny_params):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    tok = tmp_path / "tok"
    tok.mkdir()
    for path in (tokenized / "tok").glob("*-train.parquet"):  # no dev table: it cannot be read
        (tok / path.name).symlink_to(path)
    study = lr_search(
        ["baseline", "best-no-smart"],
        [1e-3, 3e-3],
        [1e-3],
        tmp_path / "lr-search.json",
        params_file=tmp_path / "params.yaml",
        tokenized_dir=tok,
        manifest_file=tokenized / "prepared" / "manifest.json",
        features_dir=None,
    )
    assert sorted((r["config"], r["lr"]) for r in study["runs"]) == [
        ("baseline", 1e-3), ("baseline", 3e-3), ("best-no-smart", 1e-3), ("best-no-smart", 3e-3)
    ]  # fmt: skip
    for run in study["runs"]:
        assert -1 <= run[SCORE] <= 1 and len(run[f"{SCORE}_per_epoch"]) == 3  # epochs 0, 1, 2
        assert run[SCORE] == max(run[f"{SCORE}_per_epoch"])  # the stage's own choice, epoch 0 included
    assert set(study["chosen"]) == {"cpu/baseline/adamw", "cpu/best-no-smart/adamaxw"}
    assert json.loads((tmp_path / "lr-search.json").read_text()) == study
    # Searching one point again replaces it; the others stay.
    again = lr_search(
        ["baseline"], [1e-3], [1e-3], tmp_path / "lr-search.json", params_file=tmp_path / "params.yaml",
        tokenized_dir=tok, manifest_file=tokenized / "prepared" / "manifest.json", features_dir=None,
    )  # fmt: skip
    assert len(again["runs"]) == 4


def test_an_unknown_configuration_is_refused(tmp_path, tiny_params):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    with pytest.raises(Exception, match="'nope' is not one of"):
        lr_search(["nope"], [1e-3], [1e-3], tmp_path / "out.json", params_file=tmp_path / "params.yaml",
                  tokenized_dir=tmp_path, manifest_file=tmp_path / "m.json")  # fmt: skip
