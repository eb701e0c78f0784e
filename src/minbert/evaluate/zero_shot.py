"""The untrained checkpoint on the multitask dev sets, its encoder untouched: STS is the
cosine of the pooled sentence vectors on the 0-5 scale; Quora, that cosine against the
threshold most accurate on a seeded sample of training pairs (no constant answer is a
candidate); SST, the training labels'
majority class (no vector says which of five classes a review is without a head) until
the stage puts the frozen checkpoint's probe in its place (:meth:`ZeroShotResult.use_sst_probe`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from minbert.data.batches import TokenizedTable, subsample
from minbert.evaluate.sentiment import encode_pooled
from minbert.metrics import as_written, score
from minbert.model.bert import BertModel
from minbert.model.heads import STS_MAX
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS


@dataclass
class ZeroShotResult:
    scores: dict[str, float]
    predictions: dict[str, np.ndarray]
    quora_threshold: float
    quora_threshold_pairs: int
    sst_majority_class: int  # of the training labels: SST's answer where no probe is fitted
    sst_method: str

    def use_sst_probe(self, predictions: np.ndarray, labels: np.ndarray, fitted: dict) -> None:
        """SST answered by a head fitted on the frozen encoder (``fitted``: its warm-up report)."""
        self.predictions["sst"] = predictions
        self.scores[TASKS["sst"].metric_key] = score("sst", labels, predictions)
        self.scores[AVERAGE] = float(np.mean([self.scores[TASKS[t].metric_key] for t in MULTITASK_TASKS]))
        self.sst_method = (
            "a linear probe on the frozen checkpoint's pooled vectors: the SST head every "
            f"configuration fits before fine-tuning, on the same {fitted['rows']} training rows "
            f"(its warm-up's pass {fitted['epochs_kept']} kept: the lowest validation loss)"
        )


def pair_cosines(
    encoder: BertModel,
    table: TokenizedTable,
    batch_size: int,
    device: torch.device,
    pooling: str,
    vectors: torch.Tensor | None = None,
) -> np.ndarray:
    """The cosine of each pair's pooled sentence vectors; ``vectors``: the pairs' frozen
    ``(rows, 2, hidden)`` vectors where the features stage has them (not encoded again)."""
    if vectors is None:
        u, v = (
            encode_pooled(encoder, table, batch_size, device, pooling=pooling, column=column)
            for column in ("input_ids_1", "input_ids_2")
        )
    else:
        u, v = vectors[:, 0], vectors[:, 1]
    return F.cosine_similarity(u, v, dim=-1).numpy()


def best_threshold(cosines: np.ndarray, labels: np.ndarray) -> float:
    """The cosine threshold (predict "paraphrase" above it) with the highest accuracy on
    these pairs, the metric the untrained row is compared in, among the cuts that split
    them (midpoints between neighbouring cosines), so no constant answer is a candidate;
    the lowest of equally good thresholds is kept."""
    values = np.unique(cosines)
    if len(values) < 2:
        raise ValueError(f"{len(cosines)} pairs with one cosine: no threshold splits them")
    candidates = (values[1:] + values[:-1]) / 2
    correct = [((cosines > t) == labels).mean() for t in candidates]
    return float(candidates[int(np.argmax(correct))])


def zero_shot(
    encoder: BertModel,
    tables: dict[tuple[str, str], TokenizedTable],
    *,
    pooling: str,
    quora_train_pairs: int,
    batch_size: int,
    device: torch.device,
    seed: int,
    dev_vectors: dict[str, torch.Tensor] | None = None,
) -> ZeroShotResult:
    """``dev_vectors``: per pair task, its dev pairs' frozen vectors (:func:`pair_cosines`)."""
    encoder.to(device)
    frozen = dev_vectors or {}
    sts_dev = tables["sts", "dev"]
    sts_cosines = pair_cosines(encoder, sts_dev, batch_size, device, pooling, frozen.get("sts"))
    sts = as_written("sts", STS_MAX / 2 * (sts_cosines + 1))

    sample = subsample(tables["quora", "train"], quora_train_pairs, seed)
    threshold = best_threshold(
        pair_cosines(encoder, sample, batch_size, device, pooling), sample.labels.astype(bool)
    )
    quora_dev = tables["quora", "dev"]
    quora = pair_cosines(encoder, quora_dev, batch_size, device, pooling, frozen.get("quora")) > threshold

    sst_train_labels = tables["sst", "train"].labels.astype(int)
    majority = int(np.bincount(sst_train_labels).argmax())
    sst = np.full(len(tables["sst", "dev"]), majority)

    predicted = {"sst": sst, "quora": quora.astype(int), "sts": sts}
    scores = {TASKS[t].metric_key: score(t, tables[t, "dev"].labels, predicted[t]) for t in MULTITASK_TASKS}
    scores[AVERAGE] = float(np.mean([scores[TASKS[t].metric_key] for t in MULTITASK_TASKS]))
    method = f"majority class of the training labels (class {majority})"
    return ZeroShotResult(scores, predicted, threshold, len(sample), majority, method)
