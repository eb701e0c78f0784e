"""Masked-language-model pretraining before fine-tuning: ``continue`` pretrains the
checkpoint further (its MLM head too, when it ships one); ``scratch`` trains a fresh small
BERT with the checkpoint's vocabulary. The corpus is the tasks' training text; a seeded
held-out part, with masks drawn once, scores every epoch on the same positions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from minbert.data.batches import length_bucketed_batches, pad
from minbert.data.corpus import Corpus
from minbert.data.masking import IGNORE, Vocabulary, mask_tokens, maskable_positions
from minbert.device import compute_context, to_device
from minbert.metrics import fixed
from minbert.model.bert import BertConfig
from minbert.model.mlm import BertForMaskedLM
from minbert.settings import MlmSettings
from minbert.train.loop import Epochs, NonFiniteGuard
from minbert.train.optim import build_optimizer, build_scheduler
from minbert.train.resume import ResumePoint, generator_states, restore_generators


def build_model(settings: MlmSettings, checkpoint_dir: Path) -> BertForMaskedLM:
    # Seeded first: a fresh model, or a fresh head on a checkpoint that lacks one,
    # draws its initial weights from the global generator.
    torch.manual_seed(settings.seed)
    if settings.start == "continue":
        return BertForMaskedLM.from_pretrained(checkpoint_dir)
    base = BertConfig.from_json(checkpoint_dir / "config.json")
    # The vocabulary must stay the checkpoint's: the tokenised tables use its ids.
    config = BertConfig(
        **{**settings.scratch_config, "vocab_size": base.vocab_size, "pad_token_id": base.pad_token_id}
    )
    return BertForMaskedLM(config)


def split_corpus(corpus: Corpus, settings: MlmSettings) -> tuple[Corpus, Corpus]:
    """(train, held-out): a seeded subsample of ``sequences`` rows, then a seeded split."""
    rng = np.random.default_rng(settings.seed)
    rows = rng.permutation(len(corpus))
    if settings.sequences:
        rows = rows[: settings.sequences]
    n_heldout = max(1, round(len(rows) * settings.heldout_fraction))
    if len(rows) - n_heldout < 1:
        raise ValueError(f"the corpus has {len(rows)} sequences: too few to hold some out")
    return corpus.subset(np.sort(rows[n_heldout:])), corpus.subset(np.sort(rows[:n_heldout]))


@dataclass
class MaskedBatch:
    """A padded batch, its masked-token labels (``IGNORE`` elsewhere), and the chosen
    positions (flat) with their targets, found on the host: on a GPU, finding them from a
    boolean mask would make the host wait every step."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor | None = None
    targets: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.positions is None:
            flat = self.labels.reshape(-1)
            self.positions = (flat != IGNORE).nonzero().squeeze(1)
            self.targets = flat[self.positions]
        self.count = len(self.positions)  # known on the host wherever the tensors are

    def to(self, device: torch.device) -> MaskedBatch:
        return MaskedBatch(
            *(
                to_device(t, device)
                for t in (
                    self.input_ids,
                    self.attention_mask,
                    self.token_type_ids,
                    self.labels,
                    self.positions,
                    self.targets,
                )
            )
        )


def masked_batches(
    corpus: Corpus, batches: list[np.ndarray], vocab: Vocabulary, generator: torch.Generator, mask_prob: float
) -> list[MaskedBatch]:
    replacement = vocab.replacement_ids()
    out = []
    for rows in batches:
        ids, mask = pad(corpus.input_ids, rows, vocab.pad_id)
        types, _ = pad(corpus.token_type_ids, rows)
        inputs, labels = mask_tokens(
            ids,
            maskable_positions(ids, mask, vocab),
            vocab=vocab,
            generator=generator,
            mask_prob=mask_prob,
            replacement_ids=replacement,
        )
        out.append(MaskedBatch(inputs, mask, types, labels))
    return out


def mlm_loss(model: BertForMaskedLM, batch: MaskedBatch) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Mean cross-entropy over the chosen positions only, with their count and the
    number predicted right (a tensor on the batch's device: nothing here waits for it)."""
    logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, positions=batch.positions)
    if batch.count == 0:
        return logits.sum() * 0.0, 0, torch.zeros((), dtype=torch.long, device=logits.device)
    loss = F.cross_entropy(logits.float(), batch.targets)
    hits = (logits.argmax(-1) == batch.targets).sum()
    return loss, batch.count, hits


@torch.inference_mode()
def evaluate_mlm(model: BertForMaskedLM, batches: list[MaskedBatch], device: torch.device) -> dict:
    model.eval()
    total_loss, total, hits = 0.0, 0, 0
    for batch in batches:
        with compute_context(device):
            loss, n, h = mlm_loss(model, batch.to(device))
        total_loss += float(loss) * n
        total += n
        hits += int(h)
    mean = total_loss / max(total, 1)
    return {
        "masked_accuracy": fixed(hits / max(total, 1)),
        "perplexity": fixed(math.exp(mean)),
        "loss": fixed(mean),
        "masked_tokens": total,
    }


@dataclass
class MlmResult:
    before: dict
    after: dict
    history: list[dict]
    corpus: dict
    optimizer_steps: int


def train_mlm(
    settings: MlmSettings,
    model: BertForMaskedLM,
    corpus: Corpus,
    vocab: Vocabulary,
    device: torch.device,
    eval_batch_size: int = 128,
    resume: ResumePoint | None = None,
) -> MlmResult:
    """Pretrain ``model`` for ``settings.epochs`` on the corpus less its held-out part;
    the held-out masked-token scores before and after, and per epoch (the history).
    The whole state is saved to ``resume`` after every epoch; a rerun continues."""
    torch.manual_seed(settings.seed)
    train, heldout = split_corpus(corpus, settings)
    # Held-out masks are drawn once, so "before" and "after" score the same positions.
    heldout_batches = masked_batches(
        heldout,
        length_bucketed_batches(heldout.input_ids.lengths(), eval_batch_size, shuffle=False),
        vocab,
        torch.Generator().manual_seed(settings.seed + 1),
        settings.mask_prob,
    )
    model.to(device)
    loop = _MlmEpochs(settings, model, train, heldout_batches, vocab, device)
    history, _ = Epochs(resume).run(loop, settings.epochs, "mlm")
    before = {k.removeprefix("heldout_"): v for k, v in history[0].items() if k.startswith("heldout_")}
    after = evaluate_mlm(model, heldout_batches, device)
    info = {
        "train_sequences": len(train),
        "heldout_sequences": len(heldout),
        "train_tokens": int(train.input_ids.lengths().sum()),
        "sources": train.counts(),
        "text": "training splits only (no dev or test text)",
    }
    return MlmResult(before, after, history, info, loop.step)


class _MlmEpochs:
    """An epoch of MLM pretraining for the epoch driver: fresh masks every epoch, AdamW under
    BERT's schedule (stepped every step), then the held-out scores; the last epoch is kept."""

    def __init__(self, settings: MlmSettings, model, train: Corpus, heldout_batches, vocab, device):
        self.settings, self.model, self.train, self.vocab, self.device = settings, model, train, vocab, device
        self.heldout_batches = heldout_batches
        self.optimizer = build_optimizer("adamw", model, lr=settings.lr, weight_decay=settings.weight_decay)
        self.rng = np.random.default_rng(settings.seed)
        self.steps_per_epoch = math.ceil(len(train) / settings.batch_size)
        total = settings.epochs * self.steps_per_epoch
        self.scheduler = build_scheduler("linear-warmup", self.optimizer, steps=total)
        self.guard = NonFiniteGuard(
            lambda at, loss: (
                f"non-finite MLM loss {loss.item()} at epoch {at[0]}, "
                f"step {at[1]}; corpus rows {', '.join(str(int(r)) for r in at[2])}"
            )
        )
        self.step = 0

    def _heldout_row(self, epoch: int, train_loss: float | None) -> dict:
        scores = evaluate_mlm(self.model, self.heldout_batches, self.device)
        return {"epoch": epoch, "train_loss": train_loss, **{f"heldout_{k}": v for k, v in scores.items()}}

    def before(self):
        # Epoch 0: the held-out scores before any update (MLM keeps its last epoch).
        return self._heldout_row(0, None), None

    def epoch(self, epoch, step, log):
        settings, model = self.settings, self.model
        model.train()
        # Dynamic masking: a generator per epoch, so every epoch has new masks.
        generator = torch.Generator().manual_seed(settings.seed * 1000 + epoch)
        order = length_bucketed_batches(
            self.train.input_ids.lengths(), settings.batch_size, shuffle=True, generator=self.rng
        )
        # Summed on the device in float64 (the host's own precision), read once an epoch.
        loss_sum, batches = torch.zeros((), dtype=torch.float64, device=self.device), 0
        for rows in order:
            batch = masked_batches(self.train, [rows], self.vocab, generator, settings.mask_prob)[0]
            batch = batch.to(self.device)
            with compute_context(self.device):
                loss, _, _ = mlm_loss(model, batch)
            self.guard.push(loss, (epoch, self.step, rows))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if settings.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            loss_sum += loss.detach().double()
            batches += 1
            self.step += 1
            # The newest loss the guard has checked: on a GPU, the step before this one.
            last = "…" if self.guard.last is None else f"{float(self.guard.last):.3f}"
            step(f"epoch {epoch} loss {last}")
        mean = float(loss_sum) / max(batches, 1)
        row = self._heldout_row(epoch, fixed(mean))
        log(
            f"epoch {epoch}: train loss {mean:.3f}, held-out masked accuracy "
            f"{row['heldout_masked_accuracy']:.3f}, perplexity {row['heldout_perplexity']:.1f}"
        )
        return row, None

    def state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generators": generator_states(self.rng),
            "step": self.step,
        }

    def load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_generators(state["generators"], self.rng)
        self.step = state["step"]
