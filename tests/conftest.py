"""Shared fixtures: the packaged checkpoint, a tiny random checkpoint, the shared data."""

from __future__ import annotations

import os
from pathlib import Path

# Under pytest-xdist (pyproject's `-n auto`) the workers share the cores: each worker, and
# every stage it starts, gets its share of threads. Threads beyond the cores make OpenMP's
# waiting threads spin against each other (measured: the whole suite 1.5x slower).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", _threads)

import pytest  # noqa: E402
import torch  # noqa: E402

from minbert.model.bert import BertConfig, BertModel  # noqa: E402
from minbert.model.checkpoint import resolve_checkpoint, save_pretrained

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "cs224n"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return resolve_checkpoint("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "ids-sst-train.csv").is_file():
        pytest.skip(f"the course data is not at {SHARED_DATA}")
    return SHARED_DATA


TINY = BertConfig(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=512,
)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, minilm_dir) -> Path:
    """A 2-layer, 32-wide random BERT with the real bert-base-uncased vocabulary."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny-bert")
    save_pretrained(BertModel(TINY), directory, minilm_dir / "vocab.txt")
    return directory


def tiny_multitask_scale(
    params: dict,
    *,
    epochs: int,
    batch_size: dict,
    lr: float = 1e-3,
    history: dict | None = None,
    test_predictions: bool = True,
) -> dict:
    """The committed cpu scale's multitask sizes cut down for a tiny model: whole
    (tiny) splits less 6 validation rows per task, every example in the history,
    ``lr`` for both optimizers and their heads, and no family's rates of its own."""
    scale = params["scales"]["cpu"]["multitask"]
    scale.update(
        epochs=epochs,
        batch_size=dict(batch_size),
        train_examples={t: 0 for t in ("sst", "quora", "sts")},
        validation_examples={t: 6 for t in ("sst", "quora", "sts")},
        history_examples=history or {"dev": 0, "train": 0},
        test_predictions=test_predictions,
        rates={},
    )
    for optimizer in scale["optimizers"].values():
        optimizer["lr"] = optimizer["head_lr"] = lr
    return params


def tiny_sentiment_scale(
    params: dict, *, batch_size: int, epochs: dict, train_examples: dict, max_tokens: int = 0
) -> dict:
    params["scales"]["cpu"]["sentiment"].update(
        batch_size={"sst": batch_size, "cfimdb": batch_size},
        max_tokens=max_tokens,
        epochs=dict(epochs),
        patience={"last-layer": 0, "full": 0},  # every epoch runs
        train_examples=dict(train_examples),
        validation_examples={"sst": 4, "cfimdb": 4},
        test_predictions=True,
    )
    return params


def saved_multitask_model(
    directory: Path, checkpoint: Path, heads: tuple, max_length: int, eval_batch_size: int
) -> Path:
    """A multitask model directory as the stages write it, with untrained heads
    (``heads``: MultitaskBert's arguments after the encoder), named by its folder."""
    from minbert.model.multitask import MultitaskBert, save_multitask

    torch.manual_seed(0)
    model = MultitaskBert(BertModel.from_pretrained(checkpoint), *heads)
    directory.mkdir()
    info = {
        "config": directory.name,
        "max_length": dict.fromkeys(("sst", "quora", "sts"), max_length),
        "eval_batch_size": eval_batch_size,
        "best_epoch": 1,
        "dev": {},
        "dev_examples": {},
        "checkpoint": {"name": "tiny"},
        "scale": "cpu",
        "seed": 0,
    }
    save_multitask(model, directory, checkpoint / "vocab.txt", info)
    return directory
