"""One shared encoder with a head per task (SST, Quora, STS). Every pass goes through
:meth:`MultitaskBert.forward` with the task's name, so that DDP sees each, SMART's too;
``forward(..., embedded)`` starts after the embedding layer, which SMART perturbs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from minbert.data.multitask import Batch
from minbert.metrics import as_written
from minbert.model.bert import BertModel
from minbert.model.checkpoint import CheckpointError, save_pretrained
from minbert.model.heads import ClassificationHead, build_pair_head, pool, run_head
from minbert.tasks import TASKS


class MultitaskBert(nn.Module):
    def __init__(
        self,
        encoder: BertModel,
        paraphrase_head: str,
        sts_head: str,
        dropout: float,
        pooling: str = "pooler",
        sts_output: str = "sigmoid",
    ):
        super().__init__()
        h = encoder.config.hidden_size
        self.encoder = encoder
        self.pooling, self.sts_output, self.dropout = pooling, sts_output, dropout
        self.head_names = {"quora": paraphrase_head, "sts": sts_head}
        # Heads that do not read BERT's pooler leave it out of training altogether
        # (data-parallel training expects a gradient for every trainable weight).
        encoder.pooler.requires_grad_(pooling == "pooler")
        self.heads = nn.ModuleDict(
            {
                "sst": ClassificationHead(h, TASKS["sst"].num_classes, dropout),
                "quora": build_pair_head(paraphrase_head, "quora", h, dropout),
                "sts": build_pair_head(sts_head, "sts", h, dropout, sts_output),
            }
        )

    def is_siamese(self, task: str) -> bool:
        return TASKS[task].is_pair and self.heads[task].siamese

    def embed(self, batch: Batch) -> torch.Tensor:
        return self.encoder.embed(batch.ids, batch.token_types)

    def pooled(self, batch: Batch, embedded: torch.Tensor | None = None) -> torch.Tensor:
        """The vectors the heads read, one per sequence (siamese: first sentences, then
        second); ``embedded`` may stack several copies of the batch, vectors then copy
        after copy."""
        embedded = self.embed(batch) if embedded is None else embedded
        copies = _copies(embedded, batch)
        mask = batch.mask if copies == 1 else batch.mask.repeat(copies, 1)
        attention = mask if batch.padded else None  # no mask: SDPA's fastest kernel
        return pool(self.encoder.encode(embedded, attention), mask, self.pooling)

    def head_output(self, task: str, pooled: torch.Tensor, copies: int = 1) -> torch.Tensor:
        """The task head on pooled vectors laid out as :meth:`pooled` gives them, for
        ``copies`` stacked copies of a batch (outputs copy after copy)."""
        if self.is_siamese(task):
            u, v = pooled.unflatten(0, (copies, 2, -1)).unbind(1)  # each (copies, pairs, hidden)
            return run_head(self.heads[task], u.flatten(0, 1), v.flatten(0, 1))
        return run_head(self.heads[task], pooled)

    def from_embedded(self, task: str, batch: Batch, embedded: torch.Tensor) -> torch.Tensor:
        """Task output from an embedding output (SMART perturbs the latter), or from
        several stacked copies of it."""
        return self.head_output(task, self.pooled(batch, embedded), _copies(embedded, batch))

    def forward(self, task: str, batch: Batch, embedded: torch.Tensor | None = None) -> torch.Tensor:
        # One entry point for every training pass (SMART's perturbed ones included),
        # so that under DistributedDataParallel each goes through its forward.
        return self.from_embedded(task, batch, self.embed(batch) if embedded is None else embedded)


def _copies(embedded: torch.Tensor, batch: Batch) -> int:
    """How many copies of ``batch``'s rows ``embedded`` stacks."""
    rows = batch.mask.shape[0]
    if embedded.shape[0] % rows:
        raise ValueError(f"an embedding output of {embedded.shape[0]} rows for a batch of {rows}")
    return embedded.shape[0] // rows


def task_loss(task: str, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of the task's head output (``minbert.tasks.HEAD_OUTPUTS``)."""
    output, kind = output.float(), TASKS[task].head_output
    if kind == "multiclass":
        return F.cross_entropy(output, labels.long())
    if kind == "binary":
        return F.binary_cross_entropy_with_logits(output, labels.float())
    return F.mse_loss(output, labels.float())


def predictions(task: str, output: torch.Tensor) -> np.ndarray:
    """Class ids, or scores at the precision prediction files hold them."""
    kind = TASKS[task].head_output
    if kind == "multiclass":
        return output.argmax(-1).numpy()
    if kind == "binary":
        return (output > 0).long().numpy()
    return as_written(task, output.numpy())


# ----------------------------------------------------------------------------- saving

# A fine-tuned multitask model's directory: the encoder in Hugging Face's format
# (config.json, model.safetensors, vocab.txt: `transformers.BertModel` loads it), the
# task heads beside it, and what the heads are and how the model was chosen.
HEADS_FILE = "heads.safetensors"
MODEL_FILE = "minbert.json"
MODEL_FORMAT = "minbert-multitask/1"


def save_multitask(model: MultitaskBert, directory: Path, vocab_file: Path, info: dict) -> None:
    """Write ``model`` to ``directory``; ``info`` (JSON) says how it was trained and chosen."""
    from safetensors.torch import save_file

    save_pretrained(model.encoder, directory, vocab_file)
    heads = {k: v.detach().contiguous().cpu() for k, v in model.heads.state_dict().items()}
    save_file(heads, str(directory / HEADS_FILE))
    described = {
        "format": MODEL_FORMAT,
        "paraphrase_head": model.head_names["quora"],
        "sts_head": model.head_names["sts"],
        "sts_output": model.sts_output,
        "pooling": model.pooling,
        "dropout": model.dropout,
        **info,
    }
    (directory / MODEL_FILE).write_text(
        json.dumps(described, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def load_multitask(directory: str | Path) -> tuple[MultitaskBert, dict]:
    """A model written by :func:`save_multitask`, in eval mode, and its ``minbert.json``; a
    directory that is not one is an error naming it and why."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    info_file = directory / MODEL_FILE
    if not info_file.is_file():
        raise CheckpointError(
            f"{directory}: not a fine-tuned multitask model (no {MODEL_FILE}; "
            "the multitask stages write them under models/multitask/)"
        )
    try:
        info = json.loads(info_file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CheckpointError(f"{info_file}: not valid JSON ({exc})") from None
    if info.get("format") != MODEL_FORMAT:
        raise CheckpointError(f"{info_file}: format {info.get('format')!r}, expected {MODEL_FORMAT!r}")
    encoder = BertModel.from_pretrained(directory)
    model = MultitaskBert(
        encoder,
        info["paraphrase_head"],
        info["sts_head"],
        info["dropout"],
        info["pooling"],
        info["sts_output"],
    )
    try:
        heads = load_file(str(directory / HEADS_FILE))
    except (FileNotFoundError, SafetensorError, OSError) as exc:
        raise CheckpointError(f"{directory / HEADS_FILE}: cannot read the task heads ({exc})") from None
    own = model.heads.state_dict()
    if set(heads) != set(own) or any(heads[k].shape != own[k].shape for k in own):
        raise CheckpointError(
            f"{directory / HEADS_FILE}: the heads do not match {MODEL_FILE} (expected {sorted(own)})"
        )
    model.heads.load_state_dict(heads)
    return model.eval(), info
