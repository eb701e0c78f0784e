"""The untrained checkpoint on the dev sets (stage `zero-shot`)."""

import json

import numpy as np
import pytest
import yaml
from conftest import REPO, tiny_multitask_scale
from test_multitask import run_in, tokenized  # noqa: F401  (the tiny tokenised tables)

from minbert.data.predictions import read_predictions
from minbert.evaluate.zero_shot import best_threshold
from minbert.pipeline import features, zero_shot
from minbert.pipeline.params import resolve_features, resolve_zero_shot
from minbert.pipeline.schema import validate
from minbert.results import read_result

SCORES = ("sst", "quora", "sts", "average")


def test_best_threshold_is_the_most_accurate_cut():
    cosines = np.array([0.1, 0.2, 0.35, 0.4, 0.8, 0.9])
    labels = np.array([0, 0, 1, 0, 1, 1], dtype=bool)
    t = best_threshold(cosines, labels)
    assert t == pytest.approx(0.275)  # 5 of 6 right, as at 0.6: the lowest of the equal cuts
    assert ((cosines > t) == labels).mean() == pytest.approx(5 / 6)


def test_best_threshold_is_never_a_constant_answer():
    # Eight paraphrases in ten: "all paraphrases" would be the most accurate answer (0.8);
    # the threshold is the most accurate of the cuts that split the pairs (0.7).
    cosines = np.arange(10.0)
    labels = np.ones(10, dtype=bool)
    labels[[2, 7]] = False
    t = best_threshold(cosines, labels)
    assert 0 < (cosines > t).sum() < len(cosines)
    splits = np.arange(9) + 0.5
    assert ((cosines > t) == labels).mean() == max(((cosines > c) == labels).mean() for c in splits) == 0.7
    assert best_threshold(np.array([0.5, 0.6]), np.array([True, True])) == pytest.approx(0.55)
    with pytest.raises(ValueError, match="no threshold splits them"):
        best_threshold(np.array([0.5, 0.5]), np.array([True, False]))


def _tiny_params(checkpoint) -> dict:
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p.update(checkpoint=str(checkpoint), device="cpu")
    tiny_multitask_scale(p, epochs=1, batch_size={"sst": 4, "quora": 4, "sts": 4})
    return p


@pytest.mark.slow
def test_stage_scores_the_untrained_checkpoint(tmp_path, tokenized, tiny_checkpoint):  # noqa: F811
    p = _tiny_params(tiny_checkpoint)
    manifest = tokenized / "prepared" / "manifest.json"
    resolved = resolve_zero_shot(validate(p), json.loads(manifest.read_text())["quora_split"])
    metrics = zero_shot.run(
        resolved, tokenized / "tok", manifest, tmp_path / "zero-shot.json", tmp_path / "pred"
    )
    assert read_result(tmp_path / "zero-shot.json") == metrics
    assert set(json.loads((tmp_path / "zero-shot.json").read_text())) == {"sst", "quora", "sts", "average"}
    assert metrics["dev_examples"] == {"sst": 24, "quora": 24, "sts": 24}
    # The record states what it was fitted with, less the seed (stated apart).
    assert metrics["settings"]["quora_train_pairs"] == p["zero_shot"]["quora_train_pairs"]
    warmup = json.loads(json.dumps(resolved["sst_probe"]["head_warmup"]))
    assert metrics["settings"]["sst_probe"]["head_warmup"] == warmup
    assert "seed" not in metrics["settings"]["sst_probe"]
    assert -1 <= metrics["sts"] <= 1 and 0 <= metrics["quora"] <= 1
    # SST: the frozen checkpoint's probe, the SST head every configuration starts from (its
    # start on dev, to the prediction); STS: scores on the 0-5 scale, as written.
    assert metrics["method"]["sst"].startswith("a linear probe on the frozen checkpoint's pooled vectors")
    sst = read_predictions(tmp_path / "pred" / "sst-dev-out.csv")
    start = run_in(tmp_path / "baseline", validate(p), "baseline", tokenized)
    assert start["start_dev"]["sst_accuracy"] == metrics["sst"]
    assert read_predictions(tmp_path / "baseline" / "pred" / "baseline" / "sst-dev-start-out.csv") == sst
    sts = [float(v) for v in read_predictions(tmp_path / "pred" / "sts-dev-out.csv").values()]
    assert len(sts) == 24 and all(0 <= v <= 5 for v in sts)
    # At a scale without the head warm-up: the training labels' majority class.
    p["scales"]["cpu"]["multitask"]["head_warmup"]["epochs"] = 0
    resolved = resolve_zero_shot(validate(p), json.loads(manifest.read_text())["quora_split"])
    plain = zero_shot.run(resolved, tokenized / "tok", manifest, tmp_path / "z.json", tmp_path / "p2")
    assert "majority class" in plain["method"]["sst"]
    assert len(set(read_predictions(tmp_path / "p2" / "sst-dev-out.csv").values())) == 1


@pytest.mark.slow
def test_stage_reads_the_dev_vectors_of_the_features_stage(tmp_path, tokenized, tiny_checkpoint):  # noqa: F811
    params = validate(_tiny_params(tiny_checkpoint))
    manifest = tokenized / "prepared" / "manifest.json"
    resolved = resolve_zero_shot(params, json.loads(manifest.read_text())["quora_split"])
    vectors = tmp_path / "features"
    features.run(resolve_features(params), tokenized / "tok", vectors)

    def run(name):
        out = tmp_path / name
        metrics = zero_shot.run(resolved, tokenized / "tok", manifest, out / "z.json", out / "pred", vectors)
        predicted = {t: read_predictions(out / "pred" / f"{t}-dev-out.csv") for t in ("sst", "sts")}
        return {k: metrics[k] for k in SCORES}, predicted

    # The features stage's vectors of the dev rows give what encoding them again gives...
    encoded = zero_shot.run(resolved, tokenized / "tok", manifest, tmp_path / "e.json", tmp_path / "e")
    scores, predicted = run("read")
    assert scores == {k: encoded[k] for k in SCORES}
    assert predicted["sts"] == read_predictions(tmp_path / "e" / "sts-dev-out.csv")
    # ...and are what the stage reads: vectors made equal make every STS pair a cosine of 1 (5.0),
    # and SST's probe answers one class for every row.
    for name in ("sts-dev-siamese", "sst-dev-sentence"):
        array = np.load(vectors / f"{name}.npy")
        np.save(vectors / f"{name}.npy", np.ones_like(array))
    _, flattened = run("flattened")
    assert {float(v) for v in flattened["sts"].values()} == {5.0}
    assert len(set(flattened["sst"].values())) == 1
    # Vectors of another pooling than the stage's are refused, not read.
    index = json.loads((vectors / "index.json").read_text())
    (vectors / "index.json").write_text(json.dumps({**index, "pooling": "cls"}))
    with pytest.raises(ValueError, match="another checkpoint or pooling"):
        run("other-pooling")
