"""The untrained checkpoint on the dev sets (stage `zero-shot`)."""

import json

import numpy as np
import pytest
import yaml
from conftest import REPO
from test_multitask import tokenized  # noqa: F401  (the tiny tokenised tables)

from minbert.data.predictions import read_predictions
from minbert.evaluate.zero_shot import best_threshold
from minbert.pipeline import zero_shot
from minbert.pipeline.params import resolve_zero_shot
from minbert.pipeline.schema import validate
from minbert.results import read_result


def test_best_threshold_is_the_most_accurate_cut():
    cosines = np.array([0.1, 0.2, 0.35, 0.4, 0.8, 0.9])
    labels = np.array([0, 0, 1, 0, 1, 1], dtype=bool)
    t = best_threshold(cosines, labels)
    assert t == pytest.approx(0.275)  # 5 of 6 right, as at 0.6: the lowest of the equal cuts
    assert ((cosines > t) == labels).mean() == pytest.approx(5 / 6)
    assert best_threshold(np.array([0.5, 0.6]), np.array([True, True])) < 0.5  # all paraphrases


@pytest.mark.slow
def test_stage_scores_the_untrained_checkpoint(tmp_path, tokenized, tiny_checkpoint):  # noqa: F811
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p.update(checkpoint=str(tiny_checkpoint), device="cpu")
    metrics = zero_shot.run(
        resolve_zero_shot(validate(p)),
        tokenized / "tok",
        tokenized / "prepared" / "manifest.json",
        tmp_path / "zero-shot.json",
        tmp_path / "pred",
    )
    assert read_result(tmp_path / "zero-shot.json") == metrics
    assert set(json.loads((tmp_path / "zero-shot.json").read_text())) == {"sst", "quora", "sts", "average"}
    assert metrics["dev_examples"] == {"sst": 24, "quora": 24, "sts": 24}
    assert -1 <= metrics["sts"] <= 1 and 0 <= metrics["quora"] <= 1
    assert "majority class" in metrics["method"]["sst"]
    # SST: the majority class everywhere; STS: scores on the 0-5 scale, as written.
    sst = read_predictions(tmp_path / "pred" / "sst-dev-out.csv")
    assert len(set(sst.values())) == 1
    sts = [float(v) for v in read_predictions(tmp_path / "pred" / "sts-dev-out.csv").values()]
    assert len(sts) == 24 and all(0 <= v <= 5 for v in sts)
