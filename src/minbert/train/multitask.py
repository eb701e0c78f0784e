"""Multitask fine-tuning: one shared encoder, three tasks, round-robin batches.

Tasks: SST 5-class sentiment (cross-entropy), Quora paraphrase (binary
cross-entropy on a logit), STS similarity (MSE on the 0-5 scale).

Each training step takes one batch of every task (round-robin). An epoch lasts as
many steps as the task with the most batches needs; a smaller task that runs out
starts a fresh pass with a new shuffle rather than replaying a cached order.
The task losses are summed and back-propagated ("round-robin"), or combined by
PCGrad gradient surgery over the shared encoder ("pcgrad"). SMART adds an
adversarial smoothness term and a Bregman proximal term against a momentum teacher.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from minbert.atomic import atomic_write_text
from minbert.data.batches import TokenizedTable, length_bucketed_batches, pad
from minbert.evaluate import accuracy, pearson, write_predictions
from minbert.model.bert import BertModel
from minbert.model.heads import ClassificationHead, build_pair_head
from minbert.progress import progress
from minbert.train.device import autocast
from minbert.train.optim import build_optimizer, build_scheduler
from minbert.train.pcgrad import pcgrad_backward
from minbert.train.resume import DEFAULT_DIRECTORY as RESUME_DIRECTORY
from minbert.train.resume import (
    ResumePoint,
    fingerprint,
    generator_states,
    restore_generators,
)
from minbert.train.sentiment import NonFiniteLoss, subsample
from minbert.train.smart import EmaTeacher, SmartSettings, bregman_loss, smoothness_loss

TASKS = ("sst", "quora", "sts")
GRADIENT_MODES = ("round-robin", "pcgrad")
# How SMART compares two outputs of each task.
DIVERGENCE = {"sst": "multiclass", "quora": "binary", "sts": "regression"}
METRIC = {"sst": "sst_accuracy", "quora": "quora_accuracy", "sts": "sts_pearson"}


@dataclass(frozen=True)
class MultitaskSettings:
    paraphrase_head: str
    sts_head: str
    gradient: str
    optimizer: str
    lr: float
    weight_decay: float
    lr_schedule: str
    lr_gamma: float
    epochs: int
    batch_size: dict[str, int]
    train_examples: dict[str, int]  # 0: the whole split
    dev_examples: dict[str, int]  # 0: the whole split
    eval_batch_size: int
    dropout: float
    grad_clip: float
    seed: int
    smart: SmartSettings | None = None
    compile: bool = False  # torch.compile the encoder's layers (pays off on a GPU)

    def __post_init__(self) -> None:
        if self.gradient not in GRADIENT_MODES:
            raise ValueError(f"gradient {self.gradient!r} is not one of {list(GRADIENT_MODES)}")
        for name in ("batch_size", "train_examples", "dev_examples"):
            if set(getattr(self, name)) != set(TASKS):
                raise ValueError(f"{name} must give a value for each of {list(TASKS)}")
        if self.epochs < 1 or min(self.batch_size.values()) < 1:
            raise ValueError("epochs and batch sizes must be at least 1")


# ----------------------------------------------------------------------------- model


@dataclass
class Batch:
    """Padded tensors of one task's batch. Siamese pairs stack both sentences:
    rows [0, n) are the first sentences, rows [n, 2n) the second."""

    ids: torch.Tensor
    mask: torch.Tensor
    token_types: torch.Tensor | None
    rows: np.ndarray  # table rows of the examples, for labels and error messages

    def to(self, device: torch.device) -> Batch:
        types = None if self.token_types is None else self.token_types.to(device)
        return Batch(self.ids.to(device), self.mask.to(device), types, self.rows)


class MultitaskBert(nn.Module):
    def __init__(self, encoder: BertModel, paraphrase_head: str, sts_head: str, dropout: float):
        super().__init__()
        h = encoder.config.hidden_size
        self.encoder = encoder
        self.heads = nn.ModuleDict({
            "sst": ClassificationHead(h, 5, dropout),
            "quora": build_pair_head(paraphrase_head, "quora", h, dropout),
            "sts": build_pair_head(sts_head, "sts", h, dropout),
        })

    def is_siamese(self, task: str) -> bool:
        return task != "sst" and self.heads[task].siamese

    def embed(self, batch: Batch) -> torch.Tensor:
        return self.encoder.embed(batch.ids, batch.token_types)

    def from_embedded(self, task: str, batch: Batch, embedded: torch.Tensor) -> torch.Tensor:
        """Task output from an embedding output (SMART perturbs the latter)."""
        pooled = self.encoder.encode(embedded, batch.mask).pooler_output
        if self.is_siamese(task):
            u, v = pooled.chunk(2)
            return self.heads[task](u, v)
        return self.heads[task](pooled)

    def forward(self, task: str, batch: Batch) -> torch.Tensor:
        return self.from_embedded(task, batch, self.embed(batch))


def task_loss(task: str, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    output = output.float()
    if task == "sst":
        return F.cross_entropy(output, labels.long())
    if task == "quora":
        return F.binary_cross_entropy_with_logits(output, labels.float())
    return F.mse_loss(output, labels.float())


def predictions(task: str, output: torch.Tensor) -> np.ndarray:
    if task == "sst":
        return output.argmax(-1).numpy()
    if task == "quora":
        return (output > 0).long().numpy()
    return output.numpy()


# ----------------------------------------------------------------------------- data


class TaskData:
    """One task's tokenised split, turned into batches for a given head family."""

    def __init__(self, task: str, table: TokenizedTable, siamese: bool):
        self.task, self.table, self.siamese = task, table, siamese
        seqs = table.sequences
        if task == "sst":
            self.lengths = seqs["input_ids"].lengths()
        elif siamese:
            self.lengths = np.maximum(seqs["input_ids_1"].lengths(), seqs["input_ids_2"].lengths())
        else:
            self.lengths = seqs["pair_input_ids"].lengths()

    def __len__(self) -> int:
        return len(self.table)

    def batch(self, rows: np.ndarray) -> Batch:
        seqs = self.table.sequences
        if self.task == "sst":
            ids, mask = pad(seqs["input_ids"], rows)
            return Batch(ids, mask, None, rows)
        if self.siamese:
            # Both sentences in one padded batch: one encoder pass serves the pair.
            both = type(seqs["input_ids_1"]).from_list(
                [seqs["input_ids_1"][i] for i in rows] + [seqs["input_ids_2"][i] for i in rows])
            ids, mask = pad(both, np.arange(2 * len(rows)))
            return Batch(ids, mask, None, rows)
        ids, mask = pad(seqs["pair_input_ids"], rows)
        types, _ = pad(seqs["pair_token_type_ids"], rows)
        return Batch(ids, mask, types, rows)

    def labels(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.table.labels[rows]).copy())


def round_robin_epoch(
    lengths: dict[str, np.ndarray], batch_size: dict[str, int], rng: np.random.Generator
) -> list[dict[str, np.ndarray]]:
    """One epoch of steps, each holding one batch (row indices) of every task.

    The epoch is as long as the task with the most batches; the others start
    another freshly shuffled pass whenever they run out, so every example of every
    task is seen at least once per epoch.
    """
    def new_pass(task):
        return length_bucketed_batches(lengths[task], batch_size[task], shuffle=True, generator=rng)

    passes = {task: new_pass(task) for task in lengths}
    steps = max(len(p) for p in passes.values())
    out = []
    for step in range(steps):
        item = {}
        for task in lengths:
            if not passes[task]:
                passes[task] = new_pass(task)
            item[task] = passes[task].pop(0)
        out.append(item)
    return out


# ----------------------------------------------------------------------------- training


@dataclass
class MultitaskResult:
    history: list[dict] = field(default_factory=list)
    conflicts: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    best: dict = field(default_factory=dict)
    dev_predictions: dict[str, np.ndarray] = field(default_factory=dict)
    test_predictions: dict[str, np.ndarray] = field(default_factory=dict)
    train_examples: dict[str, int] = field(default_factory=dict)
    dev_ids: dict[str, list[str]] = field(default_factory=dict)
    test_ids: dict[str, list[str]] = field(default_factory=dict)


@torch.inference_mode()
def evaluate(model: MultitaskBert, data: dict[str, TaskData], batch_size: int,
             device: torch.device) -> tuple[dict, dict[str, np.ndarray]]:
    """Dev losses and metrics of every task, and the predictions in row order."""
    model.eval()
    metrics, preds = {}, {}
    for task, d in data.items():
        outputs = [None] * len(d)
        for rows in length_bucketed_batches(d.lengths, batch_size, shuffle=False):
            with autocast(device):
                out = model(task, d.batch(rows).to(device)).float().cpu()
            for r, o in zip(rows, out):
                outputs[r] = o
        output = torch.stack(outputs)
        preds[task] = predictions(task, output)
        if d.table.labels is not None:
            labels = d.labels(np.arange(len(d)))
            metrics[f"dev_loss_{task}"] = task_loss(task, output, labels).item()
            score = pearson if task == "sts" else accuracy
            metrics[METRIC[task]] = score(labels.numpy(), preds[task])
    if all(METRIC[t] in metrics for t in TASKS):
        metrics["average"] = float(np.mean([metrics[METRIC[t]] for t in TASKS]))
    return metrics, preds


def train_multitask(
    settings: MultitaskSettings,
    encoder: BertModel,
    tables: dict[tuple[str, str], TokenizedTable],
    device: torch.device,
    compile_options: dict | None = None,
    resume: ResumePoint | None = None,
) -> MultitaskResult:
    """Train on ``tables[(task, "train")]``, select the best epoch on ``(task, "dev")``
    by the average of the three dev metrics, and predict dev and (where given) test."""
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    pcgrad_generator = torch.Generator().manual_seed(settings.seed)
    model = MultitaskBert(encoder, settings.paraphrase_head, settings.sts_head,
                          settings.dropout).to(device)
    if settings.compile:
        model.encoder.compile_layers(**(compile_options or {}))

    def data_for(split, limit):
        return {t: TaskData(t, subsample(tables[t, split], limit[t] if limit else 0, settings.seed),
                            model.is_siamese(t)) for t in TASKS if (t, split) in tables}

    train = data_for("train", settings.train_examples)
    dev = data_for("dev", settings.dev_examples)
    test = data_for("test", None)
    # PCGrad operates on the shared encoder; each head keeps its own task's gradient.
    shared = [p for p in model.encoder.parameters() if p.requires_grad]
    heads = [list(model.heads[t].parameters()) for t in TASKS]
    optimizer = build_optimizer(settings.optimizer, model.parameters(), lr=settings.lr,
                                weight_decay=settings.weight_decay)
    scheduler = build_scheduler(settings.lr_schedule, optimizer, gamma=settings.lr_gamma)
    teacher = EmaTeacher(model, settings.smart.beta) if settings.smart else None

    result = MultitaskResult()
    best_state = None
    lengths = {t: d.lengths for t, d in train.items()}
    steps_per_epoch = max(math.ceil(len(d) / settings.batch_size[t]) for t, d in train.items())
    global_step = 0
    first_epoch = 1
    saved = resume.load() if resume else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        if teacher is not None:
            teacher.module.load_state_dict(saved["teacher"])
        restore_generators(saved["generators"], rng, pcgrad_generator)
        result.history, result.conflicts = saved["history"], saved["conflicts"]
        result.best_epoch, result.best = saved["best_epoch"], saved["best"]
        best_state, global_step = saved["best_state"], saved["global_step"]
        first_epoch = saved["epoch"] + 1
    with progress() as bar:
        job = bar.add_task("multitask", total=settings.epochs * steps_per_epoch, status="",
                           completed=(first_epoch - 1) * steps_per_epoch)
        if saved is not None:
            bar.console.log(f"resumed from {resume.path} after epoch {first_epoch - 1}")
        for epoch in range(first_epoch, settings.epochs + 1):
            model.train()
            lr = optimizer.param_groups[0]["lr"]
            # Loss sums stay on the device: reading a loss back (.item()) waits for the
            # GPU to finish, so the loop does it once per step, for the finiteness check.
            sums = torch.zeros(len(TASKS), device=device)
            steps = round_robin_epoch(lengths, settings.batch_size, rng)
            for step, rows_by_task in enumerate(steps):
                losses, batches = [], []
                for task in TASKS:
                    batch = train[task].batch(rows_by_task[task]).to(device)
                    labels = train[task].labels(batch.rows).to(device)
                    losses.append(_task_objective(model, teacher, settings.smart, task, batch,
                                                  labels, device))
                    batches.append(batch)
                step_losses = torch.stack([loss.detach() for loss in losses])
                if not bool(torch.isfinite(step_losses).all()):
                    t = int((~torch.isfinite(step_losses)).nonzero()[0])
                    raise NonFiniteLoss(
                        f"non-finite loss {step_losses[t].item()} at epoch {epoch}, step {step}, "
                        f"task {TASKS[t]}; batch example ids: "
                        f"{', '.join(train[TASKS[t]].table.ids[i] for i in batches[t].rows)}")
                sums += step_losses
                optimizer.zero_grad(set_to_none=True)
                if settings.gradient == "pcgrad":
                    stats = pcgrad_backward(losses, shared, heads, generator=pcgrad_generator)
                    result.conflicts.append(_conflict_row(epoch, global_step, stats))
                else:
                    torch.stack(losses).sum().backward()
                if settings.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
                optimizer.step()
                if teacher is not None:
                    teacher.update(model)
                global_step += 1
                bar.update(job, advance=1, status=f"epoch {epoch} loss {step_losses.sum().item():.3f}")
            scheduler.step()
            dev_metrics, _ = evaluate(model, dev, settings.eval_batch_size, device)
            row = {"epoch": epoch, "lr": lr}
            row.update({f"train_loss_{t}": v / len(steps) for t, v in zip(TASKS, sums.tolist())})
            row.update(dev_metrics)
            result.history.append(row)
            bar.console.log(f"epoch {epoch}: " + ", ".join(
                f"{k} {dev_metrics[k]:.3f}" for k in ("sst_accuracy", "quora_accuracy", "sts_pearson",
                                                       "average")))
            if best_state is None or dev_metrics["average"] > result.best["average"]:
                result.best_epoch, result.best = epoch, dev_metrics
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            if resume:
                resume.save({
                    "epoch": epoch, "global_step": global_step,
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "teacher": teacher.module.state_dict() if teacher is not None else None,
                    "generators": generator_states(rng, pcgrad_generator),
                    "history": result.history, "conflicts": result.conflicts,
                    "best_epoch": result.best_epoch, "best": result.best, "best_state": best_state,
                })
    model.load_state_dict(best_state)
    _, result.dev_predictions = evaluate(model, dev, settings.eval_batch_size, device)
    if test:
        _, result.test_predictions = evaluate(model, test, settings.eval_batch_size, device)
    result.train_examples = {t: len(d) for t, d in train.items()}
    result.dev_ids = {t: d.table.ids for t, d in dev.items()}
    result.test_ids = {t: d.table.ids for t, d in test.items()}
    return result


def _task_objective(model, teacher, smart: SmartSettings | None, task, batch, labels, device):
    """The task loss, plus SMART's two regularisers when SMART is on."""
    with autocast(device):
        embedded = model.embed(batch)
        output = model.from_embedded(task, batch, embedded)
    loss = task_loss(task, output, labels)
    if smart is None:
        return loss
    kind = DIVERGENCE[task]
    with autocast(device):
        adversarial = smoothness_loss(lambda e: model.from_embedded(task, batch, e).float(),
                                      embedded, output.float(), kind, smart)
        with torch.no_grad():
            target = teacher.module(task, batch).float()
    return loss + smart.lambda_s * adversarial + smart.mu * bregman_loss(output.float(), target, kind)


def _conflict_row(epoch: int, step: int, stats: dict) -> dict:
    cos = stats["cosines"]
    row = {"epoch": epoch, "step": step, "conflicts": stats["conflicts"], "pairs": stats["pairs"]}
    for i in range(len(TASKS)):
        for j in range(i + 1, len(TASKS)):
            row[f"cos_{TASKS[i]}_{TASKS[j]}"] = float(cos[i, j])
    return row


# ----------------------------------------------------------------------------- stage


def run_stage(params: dict, config: str, tokenized_dir: Path, manifest_file: Path,
              metrics_dir: Path, predictions_dir: Path, mlm_dir: Path | None = None,
              resume_dir: Path | None = RESUME_DIRECTORY) -> dict:
    """The multitask stage: train one configuration and write every output.

    With ``mlm_dir`` (an ``mlm@<start>`` stage's output) fine-tuning starts from
    that pretrained checkpoint instead of ``params["checkpoint"]``, and the outputs
    are named ``<start>-<config>``. Training state is saved to ``resume_dir`` after
    every epoch, and a rerun of an interrupted stage continues from it.
    """
    from minbert import params as params_module
    from minbert.model.checkpoint import describe_checkpoint, resolve_checkpoint
    from minbert.train.device import choose_device, describe

    settings = params_module.multitask_settings(params, config)
    device = choose_device(params["device"])
    checkpoint_dir = resolve_checkpoint(params["checkpoint"]) if mlm_dir is None else Path(mlm_dir)
    name = config if mlm_dir is None else f"{Path(mlm_dir).name}-{config}"
    tables = {(t, s): TokenizedTable.read(tokenized_dir / f"{t}-{s}.parquet")
              for t in TASKS for s in ("train", "dev", "test")
              if (tokenized_dir / f"{t}-{s}.parquet").exists()}
    manifest = json.loads(Path(manifest_file).read_text(encoding="utf-8"))
    checkpoint = describe_checkpoint(
        params["checkpoint"] if mlm_dir is None
        else f"{params['checkpoint']} + MLM {Path(mlm_dir).name}", checkpoint_dir)
    resume = ResumePoint(resume_dir, f"multitask-{name}", fingerprint(
        settings=asdict(settings), checkpoint=checkpoint, device=str(device),
        data={"-".join(k): len(v) for k, v in tables.items()}, manifest=manifest))
    result = train_multitask(settings, BertModel.from_pretrained(checkpoint_dir), tables, device,
                             resume=resume)

    metrics = {
        "config": config,
        **{METRIC[t]: result.best[METRIC[t]] for t in TASKS},
        "average": result.best["average"],
        "best_epoch": result.best_epoch,
        "epochs": settings.epochs,
        "train_examples": result.train_examples,
        "dev_examples": {t: len(ids) for t, ids in result.dev_ids.items()},
        "data_split": {
            "sst": "course train / dev",
            "sts": "course train / dev",
            "quora": manifest["quora_split"],
        },
        "settings": {k: v for k, v in asdict(settings).items()
                     if k not in ("batch_size", "train_examples", "dev_examples", "seed")},
        "batch_size": settings.batch_size,
        "checkpoint": checkpoint,
        "pretraining": None if mlm_dir is None else {"start": Path(mlm_dir).name,
                                                     "directory": Path(mlm_dir).as_posix()},
        "scale": params["scale"],
        "seed": settings.seed,
        "device": describe(device),
    }
    if result.conflicts:
        conflicts = pd.DataFrame(result.conflicts)
        metrics["pcgrad_conflict_fraction"] = float(conflicts.conflicts.sum() / conflicts.pairs.sum())
    for task in TASKS:
        write_predictions(predictions_dir / name / f"{task}-dev-out.csv", task,
                          result.dev_ids[task], _format(task, result.dev_predictions[task]))
        if task in result.test_predictions:
            write_predictions(predictions_dir / name / f"{task}-test-out.csv", task,
                              result.test_ids[task], _format(task, result.test_predictions[task]))
    atomic_write_text(metrics_dir / f"{name}-history.csv",
                      pd.DataFrame(result.history).to_csv(index=False))
    # Written for every configuration (empty without PCGrad) so DVC has a fixed output.
    atomic_write_text(metrics_dir / f"{name}-conflicts.csv",
                      pd.DataFrame(result.conflicts, columns=_conflict_columns()).to_csv(index=False))
    atomic_write_text(metrics_dir / f"{name}.json", json.dumps(metrics, indent=2) + "\n")
    resume.clear()
    return metrics


def _conflict_columns() -> list[str]:
    pairs = [f"cos_{TASKS[i]}_{TASKS[j]}" for i in range(3) for j in range(i + 1, 3)]
    return ["epoch", "step", "conflicts", "pairs", *pairs]


def _format(task: str, values: np.ndarray) -> list:
    return [f"{v:.4f}" for v in values] if task == "sts" else [int(v) for v in values]
