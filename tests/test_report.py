"""The report stage on synthetic metrics files shaped like the stages' outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO

from minbert.report import write_report

PAPER = REPO / "reference" / "paper.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ["figure2-loss.png", "figure3-average.png", "figure-conflicts.png"]
CONFIGS = ["baseline", "siamese-diff", "siamese-prod", "siamese-diff-prod", "cosine-sts",
           "concatenation", "round-robin-adamaxw", "pcgrad-adamw", "pcgrad-adamaxw", "best"]
CHECKPOINT = {"name": "all-minilm-l6-v2", "weights": "model.safetensors",
              "sha256": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"}
CARVED = {"kind": "carved-from-dev", "holdout_fraction": 0.2, "seed": 0, "train_pairs": 16170,
          "heldout_pairs": 4042,
          "note": "Quora's official 141k train split was not available; both are carved from dev."}


def _scores(i: int) -> tuple[float, float, float]:
    """Distinct, recognisable numbers per configuration (SST, Quora, STS)."""
    return 0.4 + 0.01 * i + 0.00012, 0.7 + 0.01 * i + 0.00034, 0.5 + 0.01 * i + 0.00056


def write_multitask(directory: Path, configs: list[str], quora_split: dict = CARVED,
                    epochs: int = 3, steps_per_epoch: int = 20) -> None:
    """Per configuration: the JSON, the per-epoch history and the per-step conflicts."""
    directory.mkdir(parents=True, exist_ok=True)
    for config in configs:
        i = CONFIGS.index(config)
        sst, quora, sts = _scores(i)
        pcgrad = config.startswith("pcgrad") or config == "best"
        metrics = {
            "config": config, "sst_accuracy": sst, "quora_accuracy": quora, "sts_pearson": sts,
            "average": (sst + quora + sts) / 3, "best_epoch": epochs, "epochs": epochs,
            "train_examples": {"sst": 480, "quora": 480, "sts": 480},
            "dev_examples": {"sst": 400, "quora": 400, "sts": 400},
            "data_split": {"sst": "course train / dev", "sts": "course train / dev",
                           "quora": quora_split},
            "settings": {"paraphrase_head": "siamese-concat", "sts_head": "siamese-concat",
                         "gradient": "pcgrad" if pcgrad else "round-robin",
                         "optimizer": "adamaxw" if "adamaxw" in config else "adamw",
                         "lr": 5e-05, "weight_decay": 0.0, "lr_schedule": "exponential",
                         "lr_gamma": 0.9, "epochs": epochs, "eval_batch_size": 128,
                         "dropout": 0.3, "grad_clip": 1.0, "pooling": "mean",
                         "smart": {"lambda_s": 1.0} if config == "best" else None},
            "batch_size": {"sst": 16, "quora": 16, "sts": 16},
            "checkpoint": CHECKPOINT, "scale": "cpu", "seed": 11711, "device": "cpu (2 threads)",
        }
        history = pd.DataFrame({
            "epoch": range(epochs), "lr": [5e-5 * 0.9**e for e in range(epochs)],
            **{f"train_loss_{t}": [1.5 - 0.3 * e - 0.01 * i for e in range(epochs)]
               for t in ("sst", "quora", "sts")},
            "dev_loss_sst": [1.4 - 0.2 * e for e in range(epochs)],
            "sst_accuracy": [sst - 0.02 * (epochs - 1 - e) for e in range(epochs)],
            "dev_loss_quora": [0.6 - 0.05 * e for e in range(epochs)],
            "quora_accuracy": [quora - 0.02 * (epochs - 1 - e) for e in range(epochs)],
            "dev_loss_sts": [2.0 - 0.3 * e for e in range(epochs)],
            "sts_pearson": [sts - 0.02 * (epochs - 1 - e) for e in range(epochs)],
        })
        history["average"] = history[["sst_accuracy", "quora_accuracy", "sts_pearson"]].mean(axis=1)
        columns = ["epoch", "step", "conflicts", "pairs", "cos_sst_quora", "cos_sst_sts",
                   "cos_quora_sts"]
        rows = []
        if pcgrad:
            n = epochs * steps_per_epoch
            for step in range(n):
                cos = [((step * (k + 3) + i) % 11 - 4) / 10 for k in range(3)]
                rows.append([step // steps_per_epoch, step, sum(c < 0 for c in cos), 3, *cos])
            conflicts = pd.DataFrame(rows, columns=columns)
            metrics["pcgrad_conflict_fraction"] = conflicts.conflicts.sum() / conflicts.pairs.sum()
        (directory / f"{config}.json").write_text(json.dumps(metrics, indent=2) + "\n")
        history.to_csv(directory / f"{config}-history.csv", index=False)
        pd.DataFrame(rows, columns=columns).to_csv(directory / f"{config}-conflicts.csv",
                                                   index=False)


def write_sentiment(directory: Path) -> None:
    """Two Table 1 runs, shaped like minbert.train.sentiment.run_stage's output."""
    directory.mkdir(parents=True, exist_ok=True)
    for run, mode, acc in [("sst-full", "full", 0.4359673), ("sst-last-layer", "last-layer", 0.32607)]:
        metrics = {"run": run, "task": "sst", "mode": mode, "dev_accuracy": acc, "best_epoch": 2,
                   "epochs": 2, "lr": 1e-05, "batch_size": 32, "optimizer": "adamw",
                   "pooling": "mean", "train_examples": 8544, "dev_examples": 1101,
                   "data_split": "course sst train / dev", "checkpoint": CHECKPOINT,
                   "scale": "cpu", "seed": 11711, "device": "cpu (2 threads)"}
        (directory / f"{run}.json").write_text(json.dumps(metrics, indent=2) + "\n")
        pd.DataFrame({"epoch": [0, 1], "dev_accuracy": [0.4, acc]}).to_csv(
            directory / f"{run}-history.csv", index=False)


def _sections(text: str) -> dict[str, str]:
    """README text per `## ` heading, so a check can look at one table only."""
    parts = {}
    for chunk in text.split("\n## ")[1:]:
        title, _, body = chunk.partition("\n")
        parts[title.split(":")[0]] = body
    return parts


def _row(section: str, config: str) -> list[str]:
    line = next(l for l in section.splitlines() if l.startswith("|") and f"(`{config}`)" in l)
    return [c.strip() for c in line.strip("|").split(" | ")]


@pytest.fixture
def metrics(tmp_path) -> Path:
    """Every configuration but siamese-prod, and the sentiment runs."""
    root = tmp_path / "metrics"
    write_multitask(root / "multitask", [c for c in CONFIGS if c != "siamese-prod"])
    write_sentiment(root / "sentiment")
    return root


def test_tables(metrics, tmp_path):
    write_report(metrics, PAPER, tmp_path / "report")
    text = (tmp_path / "report" / "README.md").read_text(encoding="utf-8")
    sections = _sections(text)

    # Table 1 as before.
    assert "| SST (5 classes) | 0.326 | 0.391 | 0.436 | 0.515 |" in sections["Table 1"]
    assert "`sst-full`: dev accuracy 0.4360" in sections["Table 1"]

    # Table 2: ours to 3 decimals beside the paper's; the public-code baseline numbers.
    sst, quora, sts = _scores(CONFIGS.index("baseline"))
    assert _row(sections["Table 2"], "baseline")[1:] == [
        f"{sst:.3f}", "0.499", f"{quora:.3f}", "0.820", f"{sts:.3f}", "0.558",
        f"{(sst + quora + sts) / 3:.3f}", f"{(0.499 + 0.820 + 0.558) / 3:.3f}"]
    assert "public code" in sections["Table 2"]
    sst, quora, sts = _scores(CONFIGS.index("best"))
    assert _row(sections["Table 2"], "best")[1:] == [
        f"{sst:.3f}", "—", f"{quora:.3f}", "—", f"{sts:.3f}", "—", f"{(sst + quora + sts) / 3:.3f}", "—"]

    # Table 3: the configuration not run; a "|" in a label does not split the cell.
    assert _row(sections["Table 3"], "siamese-prod")[1:] == ["not run", "—"] * 4
    assert r"concat(u, v, \|u − v\|)" in sections["Table 3"]
    assert len(_row(sections["Table 3"], "siamese-diff")) == 9

    # Provenance and the carved-Quora warning under every multitask table.
    for name in ("Table 2", "Table 3", "Table 4"):
        body = sections[name]
        assert "NOT on the official Quora split" in body
        assert "141k train split was not available" in body
        assert "sha256 53aa51172d14" in body and "seed 11711" in body and "scale `cpu`" in body
        assert "training examples SST 480, Quora 480, STS 480" in body
        assert "dev examples SST 400, Quora 400, STS 400" in body
        assert "device cpu (2 threads)" in body
    assert "`siamese-prod`:" not in sections["Table 3"]          # nothing to account for
    assert "PCGrad conflict fraction" in sections["Table 4"]
    assert "SMART on" in sections["Table 4"]


def test_figures(metrics, tmp_path):
    write_report(metrics, PAPER, tmp_path / "report")
    text = (tmp_path / "report" / "README.md").read_text(encoding="utf-8")
    for name in FIGURES:
        data = (tmp_path / "report" / name).read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 10_000
        assert f"]({name})" in text
    assert "Not drawn" not in text
    # The conflicts figure's title gives the overall fraction; the caption says what it shows.
    assert "running fraction of conflicting pairs" in text
    assert "Overall fraction of conflicting task-gradient pairs: `pcgrad-adamw` 0." in text


def test_figure_with_missing_config_is_skipped(tmp_path):
    root = tmp_path / "metrics"
    write_multitask(root / "multitask", ["baseline", "pcgrad-adamw", "round-robin-adamaxw"])
    write_report(root, PAPER, tmp_path / "report")
    text = (tmp_path / "report" / "README.md").read_text(encoding="utf-8")
    assert (tmp_path / "report" / "figure2-loss.png").read_bytes().startswith(PNG_MAGIC)
    for name in ("figure3-average.png", "figure-conflicts.png"):
        assert not (tmp_path / "report" / name).exists()
    assert f"Not drawn: missing metrics `{(root / 'multitask').as_posix()}/pcgrad-adamaxw-history.csv`" in text
    assert "best-conflicts.csv" in text
    # Without sentiment metrics Table 1 still renders, saying nothing was run.
    assert "no sentiment metrics" in _sections(text)["Table 1"]


def test_official_quora_split_has_no_warning(tmp_path):
    root = tmp_path / "metrics"
    write_multitask(root / "multitask", ["baseline"], quora_split={"kind": "official"})
    write_report(root, PAPER, tmp_path / "report")
    text = (tmp_path / "report" / "README.md").read_text(encoding="utf-8")
    assert "NOT on the official" not in text
    assert "the official course train / dev split" in text


def test_sentiment_only(tmp_path):
    root = tmp_path / "metrics"
    write_sentiment(root / "sentiment")
    write_report(root, PAPER, tmp_path / "report")
    text = (tmp_path / "report" / "README.md").read_text(encoding="utf-8")
    assert "| SST (5 classes) | 0.326 | 0.391 | 0.436 | 0.515 |" in text
    assert _row(_sections(text)["Table 2"], "baseline")[1] == "not run"
    assert not list((tmp_path / "report").glob("*.png"))


def test_tables_are_data(metrics, tmp_path):
    """Rows come from paper.yaml: a one-row table shows that row only, no figures."""
    paper = yaml.safe_load(PAPER.read_text(encoding="utf-8"))
    custom = {"table1": paper["table1"],
              "table2": {"title": "Just one", "source": "test.",
                         "rows": [{"config": "cosine-sts", "label": "Cosine", "paper": {"sst": 0.5}}]}}
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(custom), encoding="utf-8")
    write_report(metrics, tmp_path / "paper.yaml", tmp_path / "report")
    text = (tmp_path / "report" / "README.md").read_text(encoding="utf-8")
    table = _sections(text)["Table 2"]
    assert [l for l in table.splitlines() if l.startswith("| ") and "`" in l] == [
        "| " + " | ".join(_row(table, "cosine-sts")) + " |"]
    assert _row(table, "cosine-sts")[2] == "0.500"
    assert "Table 3" not in text and "## Figures" not in text


def test_two_runs_are_identical(metrics, tmp_path):
    write_report(metrics, PAPER, tmp_path / "a")
    write_report(metrics, PAPER, tmp_path / "b")
    assert (tmp_path / "a" / "README.md").read_text() == (tmp_path / "b" / "README.md").read_text()
    for name in FIGURES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_no_metrics_is_an_error(tmp_path):
    (tmp_path / "metrics" / "multitask").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no metrics files to report"):
        write_report(tmp_path / "metrics", PAPER, tmp_path / "report")
    assert not (tmp_path / "report").exists()
