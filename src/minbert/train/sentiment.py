"""Single-task sentiment classification (SST 5-class, CFIMDB binary).

Two modes, as in the course project and the paper's Table 1:

* ``last-layer``: the encoder is frozen and only the head (dropout + linear on the
  pooled vector, see ``minbert.model.heads.POOLINGS``) learns. A frozen encoder gives the same pooled features for
  a sentence every epoch, so they are computed once (encoder in eval mode, no
  gradients) and the head trains on the cached features: the same model, at a
  fraction of the cost of re-encoding every sentence every epoch.
* ``full``: every encoder weight is fine-tuned along with the head.

The dev set is evaluated before the first update (epoch 0: the head as initialised)
and after each epoch; the epoch (1 or later) with the best dev accuracy is kept,
and its weights produce the dev and test predictions.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from minbert.atomic import atomic_write_text
from minbert.data.batches import (
    TokenizedTable,
    length_bucketed_batches,
    pad,
    split_by_tokens,
)
from minbert.data.tasks import TASKS
from minbert.evaluate import write_predictions
from minbert.metrics import accuracy, fixed, history_csv
from minbert.model.bert import BertModel
from minbert.model.heads import POOLINGS, ClassificationHead, SentimentClassifier, pool
from minbert.progress import progress
from minbert.train.device import compute_context
from minbert.train.optim import build_optimizer, build_scheduler
from minbert.train.resume import DEFAULT_DIRECTORY as RESUME_DIRECTORY
from minbert.train.resume import (
    ResumePoint,
    fingerprint,
    generator_states,
    restore_generators,
)

MODES = ("last-layer", "full")


@dataclass(frozen=True)
class SentimentSettings:
    task: str
    mode: str
    lr: float
    epochs: int
    batch_size: int
    eval_batch_size: int
    dropout: float
    weight_decay: float
    optimizer: str
    lr_schedule: str
    lr_gamma: float
    grad_clip: float
    train_examples: int  # 0: the whole training split
    seed: int
    max_tokens: int = 0  # padded tokens per forward pass (0: no limit); bounds memory
    pooling: str = "pooler"  # a name of minbert.model.heads.POOLINGS

    def __post_init__(self) -> None:
        if self.task not in ("sst", "cfimdb"):
            raise ValueError(f"task {self.task!r} is not one of ['cfimdb', 'sst']")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {list(MODES)}")
        for name in ("epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.train_examples < 0:
            raise ValueError(f"train_examples must be 0 (all) or positive, got {self.train_examples}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {sorted(POOLINGS)}")


@dataclass
class SentimentResult:
    history: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    dev_accuracy: float = float("nan")
    dev_predictions: np.ndarray | None = None
    test_predictions: np.ndarray | None = None
    train_examples: int = 0


class NonFiniteLoss(FloatingPointError):
    pass


def subsample(table: TokenizedTable, n: int, seed: int) -> TokenizedTable:
    """A seeded random subset of ``n`` rows (kept in file order); all rows when n is 0."""
    if n == 0 or n >= len(table):
        return table
    rows = np.sort(np.random.default_rng(seed).choice(len(table), size=n, replace=False))
    return table.subset(rows)


def _check_finite(loss: torch.Tensor, epoch: int, step: int, task: str, ids: list[str]) -> None:
    if not torch.isfinite(loss):
        raise NonFiniteLoss(
            f"non-finite loss {loss.item()} at epoch {epoch}, step {step}, task {task}; "
            f"batch example ids: {', '.join(ids)}"
        )


@torch.inference_mode()
def encode_pooled(
    encoder: BertModel, table: TokenizedTable, batch_size: int, device: torch.device,
    max_tokens: int = 0, pooling: str = "pooler", column: str = "input_ids",
) -> torch.Tensor:
    """The pooled vector of every row's ``column`` sequence, in row order (encoder in
    eval mode)."""
    was_training = encoder.training
    encoder.eval()
    seqs = table.sequences[column]
    out = torch.empty(len(table), encoder.config.hidden_size)
    batches = length_bucketed_batches(seqs.lengths(), batch_size, shuffle=False)
    with progress() as bar:
        job = bar.add_task(f"encode {len(table)} rows", total=len(batches), status="")
        for batch in batches:
            for rows in split_by_tokens(batch, seqs.lengths(), max_tokens):
                ids, mask = pad(seqs, rows)
                with compute_context(device):
                    mask = mask.to(device)
                    pooled = pool(encoder(ids.to(device), mask), mask, pooling)
                out[torch.from_numpy(rows)] = pooled.float().cpu()
            bar.advance(job)
    encoder.train(was_training)
    return out


@torch.inference_mode()
def predict_logits(
    model: SentimentClassifier, table: TokenizedTable, batch_size: int, device: torch.device,
    max_tokens: int = 0,
) -> torch.Tensor:
    model.eval()
    seqs = table.sequences["input_ids"]
    out = torch.empty(len(table), model.head.linear.out_features)
    batches = length_bucketed_batches(seqs.lengths(), batch_size, shuffle=False)
    for rows in (piece for b in batches for piece in split_by_tokens(b, seqs.lengths(), max_tokens)):
        ids, mask = pad(seqs, rows)
        with compute_context(device):
            logits = model(ids.to(device), mask.to(device))
        out[torch.from_numpy(rows)] = logits.float().cpu()
    return out


def train_sentiment(
    settings: SentimentSettings,
    encoder: BertModel,
    train: TokenizedTable,
    dev: TokenizedTable,
    test: TokenizedTable | None,
    device: torch.device,
    resume: ResumePoint | None = None,
) -> SentimentResult:
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    train = subsample(train, settings.train_examples, settings.seed)
    num_classes = TASKS[settings.task].num_classes
    for name, table in (("train", train), ("dev", dev)):
        if table.labels is None:
            raise ValueError(f"{settings.task} {name} split has no labels")
        bad = (table.labels < 0) | (table.labels >= num_classes)
        if bad.any():
            raise ValueError(f"{settings.task} {name}: label outside 0..{num_classes - 1} "
                             f"for ids {[table.ids[i] for i in np.flatnonzero(bad)[:5]]}")
    if settings.mode == "last-layer":
        return _train_head_on_features(settings, encoder, train, dev, test, device, rng, resume)
    return _fine_tune(settings, encoder, train, dev, test, device, rng, resume)


def _epoch_loop(settings, n_batches_per_epoch, run_epoch, evaluate, state_of, load_state, optimizer,
                rng, resume: ResumePoint | None):
    """Shared epoch loop: train, evaluate on dev, keep the best epoch's weights.

    After every epoch the whole training state goes to ``resume``; a rerun after an
    interruption starts from the epoch after the last one saved.
    """
    scheduler = build_scheduler(settings.lr_schedule, optimizer, gamma=settings.lr_gamma)
    result = SentimentResult()
    best_state = None
    first_epoch = 1
    saved = resume.load() if resume else None
    if saved is not None:
        load_state(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        restore_generators(saved["generators"], rng)
        result.history, result.best_epoch = saved["history"], saved["best_epoch"]
        result.dev_accuracy, best_state = saved["dev_accuracy"], saved["best_state"]
        first_epoch = saved["epoch"] + 1
    with progress() as bar:
        job = bar.add_task(
            f"{settings.task} {settings.mode}", total=settings.epochs * n_batches_per_epoch, status="",
            completed=(first_epoch - 1) * n_batches_per_epoch,
        )
        if saved is not None:
            bar.console.log(f"resumed from {resume.path} after epoch {first_epoch - 1}")
        else:
            dev_loss, dev_acc = evaluate()
            result.history.append(dict(epoch=0, lr=None, train_loss=None, train_accuracy=None,
                                       dev_loss=fixed(dev_loss), dev_accuracy=fixed(dev_acc)))
        for epoch in range(first_epoch, settings.epochs + 1):
            lr = optimizer.param_groups[0]["lr"]
            train_loss, train_acc = run_epoch(epoch, lambda loss: bar.update(
                job, advance=1, status=f"epoch {epoch} loss {loss:.3f}"))
            dev_loss, dev_acc = evaluate()
            scheduler.step()
            result.history.append(dict(
                epoch=epoch, lr=lr, train_loss=fixed(train_loss), train_accuracy=fixed(train_acc),
                dev_loss=fixed(dev_loss), dev_accuracy=fixed(dev_acc),
            ))
            bar.console.log(f"epoch {epoch}: train loss {train_loss:.4f} acc {train_acc:.3f} | "
                            f"dev loss {dev_loss:.4f} acc {dev_acc:.3f}")
            # Strictly better only: ties keep the earlier (cheaper, less fitted) epoch.
            if best_state is None or dev_acc > result.dev_accuracy:
                result.best_epoch, result.dev_accuracy = epoch, dev_acc
                best_state = state_of()
            if resume:
                resume.save({
                    "epoch": epoch, "model": state_of(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "generators": generator_states(rng),
                    "history": result.history, "best_epoch": result.best_epoch,
                    "dev_accuracy": result.dev_accuracy, "best_state": best_state,
                })
    load_state(best_state)
    return result


def _train_head_on_features(settings, encoder, train, dev, test, device, rng, resume) -> SentimentResult:
    num_classes = TASKS[settings.task].num_classes
    encoder.to(device)
    feats = {name: encode_pooled(encoder, t, settings.eval_batch_size, device, settings.max_tokens,
                                 settings.pooling)
             for name, t in (("train", train), ("dev", dev), ("test", test)) if t is not None}
    head = ClassificationHead(encoder.config.hidden_size, num_classes, settings.dropout).to(device)
    optimizer = build_optimizer(settings.optimizer, head, lr=settings.lr,
                                weight_decay=settings.weight_decay)
    y_train = torch.tensor(train.labels, dtype=torch.long)
    y_dev = torch.tensor(dev.labels, dtype=torch.long)
    n_batches = math.ceil(len(train) / settings.batch_size)

    def run_epoch(epoch, tick):
        head.train()
        order = torch.from_numpy(rng.permutation(len(train)))
        total, correct = 0.0, 0
        for step, rows in enumerate(order.split(settings.batch_size)):
            x, y = feats["train"][rows].to(device), y_train[rows].to(device)
            logits = head(x)
            loss = F.cross_entropy(logits, y)
            _check_finite(loss, epoch, step, settings.task, [train.ids[i] for i in rows.tolist()])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(rows)
            correct += int((logits.argmax(-1) == y).sum())
            tick(loss.item())
        return total / len(train), correct / len(train)

    @torch.inference_mode()
    def logits_of(name):
        head.eval()
        return head(feats[name].to(device)).float().cpu()

    def evaluate():
        logits = logits_of("dev")
        return F.cross_entropy(logits, y_dev).item(), accuracy(dev.labels, logits.argmax(-1).numpy())

    result = _epoch_loop(settings, n_batches, run_epoch, evaluate,
                         lambda: copy.deepcopy(head.state_dict()), head.load_state_dict, optimizer,
                         rng, resume)
    result.dev_predictions = logits_of("dev").argmax(-1).numpy()
    if test is not None:
        result.test_predictions = logits_of("test").argmax(-1).numpy()
    result.train_examples = len(train)
    return result


def _fine_tune(settings, encoder, train, dev, test, device, rng, resume) -> SentimentResult:
    num_classes = TASKS[settings.task].num_classes
    model = SentimentClassifier(encoder, num_classes, settings.dropout, settings.pooling).to(device)
    optimizer = build_optimizer(settings.optimizer, model, lr=settings.lr,
                                weight_decay=settings.weight_decay)
    seqs = train.sequences["input_ids"]
    lengths = seqs.lengths()
    n_batches = math.ceil(len(train) / settings.batch_size)

    def run_epoch(epoch, tick):
        model.train()
        total, correct = 0.0, 0
        batches = length_bucketed_batches(lengths, settings.batch_size, shuffle=True, generator=rng)
        for step, batch in enumerate(batches):
            optimizer.zero_grad(set_to_none=True)
            batch_loss = 0.0
            # Pieces under the token budget, gradients accumulated: the same update as
            # the whole batch at once (the loss is the batch mean), in bounded memory.
            for rows in split_by_tokens(batch, lengths, settings.max_tokens):
                ids, mask = pad(seqs, rows)
                y = torch.as_tensor(train.labels[rows], dtype=torch.long, device=device)
                with compute_context(device):
                    logits = model(ids.to(device), mask.to(device))
                loss = F.cross_entropy(logits.float(), y, reduction="sum") / len(batch)
                _check_finite(loss, epoch, step, settings.task, [train.ids[i] for i in batch])
                loss.backward()
                batch_loss += loss.item()
                correct += int((logits.argmax(-1) == y).sum())
            if settings.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            optimizer.step()
            total += batch_loss * len(batch)
            tick(batch_loss)
        return total / len(train), correct / len(train)

    def evaluate():
        logits = predict_logits(model, dev, settings.eval_batch_size, device, settings.max_tokens)
        y = torch.tensor(dev.labels, dtype=torch.long)
        return F.cross_entropy(logits, y).item(), accuracy(dev.labels, logits.argmax(-1).numpy())

    def state_of():
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    result = _epoch_loop(settings, n_batches, run_epoch, evaluate, state_of, model.load_state_dict,
                         optimizer, rng, resume)
    result.dev_predictions = predict_logits(
        model, dev, settings.eval_batch_size, device, settings.max_tokens).argmax(-1).numpy()
    if test is not None:
        result.test_predictions = predict_logits(
            model, test, settings.eval_batch_size, device, settings.max_tokens).argmax(-1).numpy()
    result.train_examples = len(train)
    return result


def run_stage(params: dict, run: str, tokenized_dir: Path, metrics_dir: Path,
              predictions_dir: Path, resume_dir: Path | None = RESUME_DIRECTORY) -> dict:
    """The sentiment stage of the pipeline: train one run, write every output.

    Writes ``metrics_dir/<run>.json`` (the numbers and how they were produced),
    ``metrics_dir/<run>-history.csv`` (per-epoch rows for plots) and the course-format
    dev and test predictions under ``predictions_dir/<run>/``. Training state is
    saved to ``resume_dir`` after every epoch; a rerun after an interruption resumes.
    """
    from minbert import params as params_module
    from minbert.model.checkpoint import describe_checkpoint, resolve_checkpoint
    from minbert.train.device import choose_device, describe
    from minbert.train.distributed import require_single_process

    require_single_process("sentiment")

    settings = params_module.sentiment_settings(params, run)
    device = choose_device(params["device"])
    checkpoint_dir = resolve_checkpoint(params["checkpoint"])
    tables = {
        split: TokenizedTable.read(tokenized_dir / f"{settings.task}-{split}.parquet")
        for split in ("train", "dev", "test")
        if split != "test" or (tokenized_dir / f"{settings.task}-test.parquet").exists()
    }
    encoder = BertModel.from_pretrained(checkpoint_dir)
    checkpoint = describe_checkpoint(params["checkpoint"], checkpoint_dir)
    resume = ResumePoint(resume_dir, f"sentiment-{run}", fingerprint(
        settings=asdict(settings), checkpoint=checkpoint, device=str(device),
        data={k: len(v) for k, v in tables.items()}))
    result = train_sentiment(settings, encoder, tables["train"], tables["dev"], tables.get("test"),
                             device, resume=resume)
    metrics = {
        "run": run,
        "task": settings.task,
        "mode": settings.mode,
        "dev_accuracy": fixed(result.dev_accuracy),
        "best_epoch": result.best_epoch,
        "epochs": settings.epochs,
        "lr": settings.lr,
        "batch_size": settings.batch_size,
        "optimizer": settings.optimizer,
        "pooling": settings.pooling,
        "train_examples": result.train_examples,
        "dev_examples": len(tables["dev"]),
        "data_split": f"course {settings.task} train / dev",
        "checkpoint": checkpoint,
        "scale": params["scale"],
        "seed": settings.seed,
        "device": describe(device),
    }
    write_predictions(predictions_dir / run / "dev-out.csv", settings.task, tables["dev"].ids,
                      result.dev_predictions.tolist())
    if "test" in tables:
        write_predictions(predictions_dir / run / "test-out.csv", settings.task,
                          tables["test"].ids, result.test_predictions.tolist())
    atomic_write_text(metrics_dir / f"{run}-history.csv", history_csv(result.history))
    atomic_write_text(metrics_dir / f"{run}.json", json.dumps(metrics, indent=2) + "\n")
    resume.clear()
    return metrics
