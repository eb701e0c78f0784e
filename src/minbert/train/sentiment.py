"""Single-task sentiment classification (SST 5-class, CFIMDB binary), the paper's Table 1:
``last-layer`` trains the head alone on the frozen encoder's pooled vectors (computed
once, in eval mode), ``full`` fine-tunes everything. The epoch (0, the start, or later)
with the best validation MCC is kept; dev chooses nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from minbert.data.batches import (
    TokenizedTable,
    length_bucketed_batches,
    pad,
    split_by_tokens,
)
from minbert.data.validation_split import run_rows
from minbert.device import compute_context, to_device
from minbert.evaluate.sentiment import encode_pooled, logits_from_pooled, predict_logits
from minbert.metrics import accuracy, correlation_noise, fixed, mcc
from minbert.model.bert import BertModel
from minbert.model.heads import ClassificationHead, SentimentClassifier
from minbert.settings import SentimentSettings
from minbert.tasks import TASKS
from minbert.train.loop import Epochs, NonFiniteGuard, cpu_copy
from minbert.train.optim import build_optimizer, build_scheduler
from minbert.train.resume import ResumePoint, generator_states, restore_generators


@dataclass
class SentimentResult:
    history: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    dev_accuracy: float = float("nan")
    dev_predictions: np.ndarray | None = None
    test_predictions: np.ndarray | None = None
    train_examples: int = 0
    validation_examples: int = 0
    optimizer_steps: int = 0  # over all epochs
    examples_seen: int = 0  # training rows consumed over all epochs (every row once an epoch)


def train_sentiment(
    settings: SentimentSettings,
    encoder: BertModel,
    train: TokenizedTable,
    dev: TokenizedTable,
    test: TokenizedTable | None,
    device: torch.device,
    resume: ResumePoint | None = None,
    pooled: dict[str, torch.Tensor] | None = None,
) -> SentimentResult:
    # pooled: the frozen encoder's vectors of the run's splits (the sentiment-features
    # stage's): the last-layer arm's, the full arm's start, not encoded again.
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    num_classes = TASKS[settings.task].num_classes
    if train.labels is None:
        raise ValueError(f"{settings.task} train split has no labels")
    train, validation = run_rows(train, settings.validation_examples, settings.train_examples, settings.seed)
    for name, table in (("train", train), ("validation", validation), ("dev", dev)):
        if table.labels is None:
            raise ValueError(f"{settings.task} {name} split has no labels")
        bad = (table.labels < 0) | (table.labels >= num_classes)
        if bad.any():
            raise ValueError(
                f"{settings.task} {name}: label outside 0..{num_classes - 1} "
                f"for ids {[table.ids[i] for i in np.flatnonzero(bad)[:5]]}"
            )
    train_mode = _train_head_on_features if settings.mode == "last-layer" else _fine_tune
    result = train_mode(settings, encoder, train, validation, dev, test, device, rng, resume, pooled)
    result.dev_accuracy = accuracy(dev.labels, result.dev_predictions)
    result.train_examples, result.validation_examples = len(train), len(validation)
    result.examples_seen = len(train) * (len(result.history) - 1)
    return result


def _scores(labels: np.ndarray, logits: torch.Tensor) -> tuple[float, float, float]:
    """Loss, accuracy (the table's metric) and MCC (the selection metric) of the logits."""
    predicted = logits.argmax(-1).numpy()
    loss = F.cross_entropy(logits, torch.tensor(labels, dtype=torch.long)).item()
    return loss, accuracy(labels, predicted), mcc(labels, predicted)


def _score_dev_once(result: SentimentResult, labels: np.ndarray, logits: torch.Tensor) -> None:
    """Dev, scored with the kept epoch: its predictions, and the dev columns of its history
    row (the start's are scored before training; no other epoch's are)."""
    loss, acc, m = _scores(labels, logits)
    result.history[result.best_epoch].update(dev_loss=fixed(loss), dev_accuracy=fixed(acc), dev_mcc=fixed(m))
    result.dev_predictions = logits.argmax(-1).numpy()


class _Epochs:
    """A sentiment mode's epoch for the epoch driver: ``train_epoch(epoch, tick)`` (mean loss
    and accuracy), then ``evaluate(splits)`` ((loss, accuracy, MCC) on each: validation
    every epoch, dev at the start only), then the schedule's step. Selection: the
    validation MCC."""

    def __init__(self, settings, model, optimizer, rng, steps_per_epoch, train_epoch, evaluate):
        self.model, self.optimizer, self.rng = model, optimizer, rng
        self.steps_per_epoch, self.train_epoch, self.evaluate = steps_per_epoch, train_epoch, evaluate
        self.scheduler = build_scheduler(settings.lr_schedule, optimizer, gamma=settings.lr_gamma)

    @staticmethod
    def _row(epoch, lr, train, validation, dev=(None, None, None)) -> dict:
        (val_loss, val_acc, val_mcc), (dev_loss, dev_acc, dev_mcc) = validation, dev
        return dict(
            epoch=epoch,
            lr=lr,
            train_loss=fixed(train[0]),
            train_accuracy=fixed(train[1]),
            val_loss=fixed(val_loss),
            val_accuracy=fixed(val_acc),
            val_mcc=fixed(val_mcc),
            dev_loss=fixed(dev_loss),
            dev_accuracy=fixed(dev_acc),
            dev_mcc=fixed(dev_mcc),
        )

    def before(self):
        row = self._row(0, None, (None, None), *self.evaluate(("validation", "dev")))
        # Chosen on the score as written: the report replays the choice from the history.
        return row, row["val_mcc"]

    def epoch(self, epoch, step, log):
        lr = self.optimizer.param_groups[0]["lr"]
        # The newest loss the guard has checked (on a GPU, one step behind).
        train_loss, train_acc = self.train_epoch(
            epoch, lambda loss: step(f"epoch {epoch} loss {'…' if loss is None else f'{loss:.3f}'}")
        )
        (scores,) = self.evaluate(("validation",))  # dev: scored once, with the kept epoch
        self.scheduler.step()
        val_loss, val_acc, val_mcc = scores
        log(
            f"epoch {epoch}: train loss {train_loss:.4f} acc {train_acc:.3f} | "
            f"validation loss {val_loss:.4f} acc {val_acc:.3f} MCC {val_mcc:.3f}"
        )
        row = self._row(epoch, lr, (train_loss, train_acc), scores)
        return row, row["val_mcc"]

    def state(self) -> dict:
        return {
            "model": cpu_copy(self.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generators": generator_states(self.rng),
        }

    def load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_generators(state["generators"], self.rng)


def _run_epochs(settings, loop: _Epochs, resume: ResumePoint | None) -> SentimentResult:
    """Every epoch through the driver; the result holds the history and the epoch kept,
    whose weights ``loop.model`` now has."""
    description = f"{settings.task} {settings.mode}"
    # Patience counts epochs that rise no more than validation MCC's noise above the last
    # gain: a wobble on a few hundred rows is no gain (docs/method.md, "Table 1's plateau").
    history, best_epoch = Epochs(resume).run(
        loop,
        settings.epochs,
        description,
        settings.patience,
        margin=lambda reference: correlation_noise(reference, settings.validation_examples),
    )
    # One optimizer step per batch, every epoch run.
    return SentimentResult(history, best_epoch, optimizer_steps=loop.steps_per_epoch * (len(history) - 1))


def _epoch_sums(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """An epoch's loss and correct-answer sums, kept on the device and read once the
    epoch is done (reading them every step would make the host wait for the device).
    The loss sum is float64, the precision the host would have summed in."""
    return (
        torch.zeros((), dtype=torch.float64, device=device),
        torch.zeros((), dtype=torch.long, device=device),
    )


def _guard(task: str) -> NonFiniteGuard:
    return NonFiniteGuard(
        lambda step, loss: (
            f"non-finite loss {loss.item()} at epoch {step[0]}, "
            f"step {step[1]}, task {task}; batch example ids: "
            f"{', '.join(step[2])}"
        )
    )


def _train_head_on_features(
    settings, encoder, train, validation, dev, test, device, rng, resume, pooled
) -> SentimentResult:
    num_classes = TASKS[settings.task].num_classes
    guard = _guard(settings.task)
    encoder.to(device)
    feats = pooled or {
        name: encode_pooled(
            encoder, t, settings.eval_batch_size, device, settings.max_tokens, settings.pooling
        )
        for name, t in (("train", train), ("validation", validation), ("dev", dev), ("test", test))
        if t is not None
    }
    head = ClassificationHead(encoder.config.hidden_size, num_classes, settings.dropout).to(device)
    optimizer = build_optimizer(settings.optimizer, head, lr=settings.lr, weight_decay=settings.weight_decay)
    y_train = torch.tensor(train.labels, dtype=torch.long)
    y = {
        "validation": torch.tensor(validation.labels, dtype=torch.long),
        "dev": torch.tensor(dev.labels, dtype=torch.long),
    }
    n_batches = math.ceil(len(train) / settings.batch_size)

    def run_epoch(epoch, tick):
        head.train()
        order = torch.from_numpy(rng.permutation(len(train)))
        total, correct = _epoch_sums(device)
        for step, rows in enumerate(order.split(settings.batch_size)):
            x, y = to_device(feats["train"][rows], device), to_device(y_train[rows], device)
            logits = head(x)
            loss = F.cross_entropy(logits, y)
            guard.push(loss, (epoch, step, [train.ids[i] for i in rows.tolist()]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach().double() * len(rows)
            correct += (logits.argmax(-1) == y).sum()
            tick(guard.last)
        return float(total) / len(train), int(correct) / len(train)

    @torch.inference_mode()
    def logits_of(name):
        head.eval()
        return head(feats[name].to(device)).float().cpu()

    def evaluate(splits):
        return tuple(_scores(y[name].numpy(), logits_of(name)) for name in splits)

    result = _run_epochs(
        settings, _Epochs(settings, head, optimizer, rng, n_batches, run_epoch, evaluate), resume
    )
    _score_dev_once(result, y["dev"].numpy(), logits_of("dev"))
    if test is not None:
        result.test_predictions = logits_of("test").argmax(-1).numpy()
    return result


def _fine_tune(
    settings, encoder, train, validation, dev, test, device, rng, resume, pooled
) -> SentimentResult:
    num_classes = TASKS[settings.task].num_classes
    guard = _guard(settings.task)
    model = SentimentClassifier(encoder, num_classes, settings.dropout, settings.pooling).to(device)
    optimizer = build_optimizer(
        settings.optimizer,
        model,
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        head_lr=settings.head_lr,
    )
    seqs = train.sequences["input_ids"]
    lengths = seqs.lengths()
    n_batches = math.ceil(len(train) / settings.batch_size)

    trained = False  # until then the encoder is the frozen one that gave ``pooled``

    def run_epoch(epoch, tick):
        nonlocal trained
        trained = True
        model.train()
        total, correct = _epoch_sums(device)
        batches = length_bucketed_batches(lengths, settings.batch_size, shuffle=True, generator=rng)
        for step, batch in enumerate(batches):
            optimizer.zero_grad(set_to_none=True)
            batch_loss = torch.zeros((), dtype=torch.float64, device=device)
            at = (epoch, step, [train.ids[i] for i in batch])  # where, for the guard's message
            # Pieces under the token budget, gradients accumulated: the same update as
            # the whole batch at once (the loss is the batch mean), in bounded memory.
            for rows in split_by_tokens(batch, lengths, settings.max_tokens):
                ids, mask = pad(seqs, rows)
                y = to_device(torch.as_tensor(train.labels[rows], dtype=torch.long), device)
                with compute_context(device):
                    logits = model(to_device(ids, device), to_device(mask, device))
                loss = F.cross_entropy(logits.float(), y, reduction="sum") / len(batch)
                guard.push(loss, at)
                loss.backward()
                batch_loss += loss.detach().double()
                correct += (logits.argmax(-1) == y).sum()
            if settings.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            optimizer.step()
            total += batch_loss * len(batch)
            tick(guard.last)
        return float(total) / len(train), int(correct) / len(train)

    def logits_of(table, name=None):
        if pooled is not None and not trained and name in pooled:
            return logits_from_pooled(
                model, pooled[name], table, settings.eval_batch_size, device, settings.max_tokens
            )
        return predict_logits(model, table, settings.eval_batch_size, device, settings.max_tokens)

    def evaluate(splits):
        tables = {"validation": validation, "dev": dev}
        return tuple(_scores(tables[name].labels, logits_of(tables[name], name)) for name in splits)

    result = _run_epochs(
        settings, _Epochs(settings, model, optimizer, rng, n_batches, run_epoch, evaluate), resume
    )
    _score_dev_once(result, dev.labels, logits_of(dev))
    if test is not None:
        result.test_predictions = logits_of(test).argmax(-1).numpy()
    return result
