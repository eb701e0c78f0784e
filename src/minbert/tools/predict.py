"""A fine-tuned multitask model (``models/multitask/<config>/``) on new text: predictions for
a file or a few sentences, and scores with a bootstrap interval for a labelled file.
Inputs are read with the data stage's rules; a bad row stops with ``file:line: reason``."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from minbert.data.batches import TokenizedTable, length_bucketed_batches
from minbert.data.csvfile import read_task_csv
from minbert.data.multitask import TaskData
from minbert.data.predictions import write_predictions
from minbert.data.tokenize import load_tokenizer, tokenize_table
from minbert.device import choose_device, compute_context, pad_multiple
from minbert.metrics import CONFIDENCE, Interval, interval
from minbert.model.multitask import load_multitask, predictions
from minbert.pipeline.multitask import TRAINING_IDS
from minbert.pipeline.schema import read as read_params
from minbert.progress import progress
from minbert.tasks import MULTITASK_TASKS, TASKS

SST_CLASSES = ("negative", "somewhat negative", "neutral", "somewhat positive", "positive")


@dataclass
class Predicted:
    task: str
    ids: list[str]
    predictions: np.ndarray
    labels: np.ndarray | None
    source: str
    probabilities: np.ndarray | None = None  # SST: of each class; Quora: of a paraphrase


class Predictor:
    """A fine-tuned multitask model ready to predict, with its tokenizer."""

    def __init__(self, model_dir: str | Path, device: str = "auto"):
        self.model_dir = Path(model_dir)
        self.model, self.info = load_multitask(self.model_dir)
        self.device = choose_device(device)
        self.model.to(self.device)
        self.tokenizer = load_tokenizer(self.model_dir / "vocab.txt")

    def predict(self, frame: pd.DataFrame, task: str, source: str, show_progress: bool = False) -> Predicted:
        """Predict the rows of ``frame`` (columns ``id``, the task's text columns and,
        when labelled, ``label``), batched by length as the stage evaluated them."""
        if task not in MULTITASK_TASKS:
            raise ValueError(
                f"task {task!r} is not one of {list(MULTITASK_TASKS)} (the multitask model's tasks)"
            )
        arrow, _ = tokenize_table(frame, task, self.tokenizer, self.info["max_length"][task])
        table = TokenizedTable.from_arrow(arrow, source)
        if not len(table):
            raise ValueError(f"{source}: no rows to predict")
        output = self._outputs(TaskData(task, table, self.model.is_siamese(task)), show_progress)
        return Predicted(
            task, table.ids, predictions(task, output), table.labels, source, probabilities(task, output)
        )

    @torch.inference_mode()
    def _outputs(self, data: TaskData, show_progress: bool) -> torch.Tensor:
        """The head's outputs in row order, from the stage's evaluation batches (rows
        sorted by length, the model's evaluation batch size), kept for probabilities."""
        batches = length_bucketed_batches(data.lengths, self.info["eval_batch_size"], shuffle=False)
        outputs = [None] * len(data)
        with progress(quiet=not show_progress) as bar:
            job = bar.add_task(f"{data.task}: {len(data)} examples", total=len(batches), status="")
            for rows in batches:
                with compute_context(self.device):
                    batch = data.batch(rows, pad_multiple(self.device)).to(self.device)
                    for row, out in zip(rows, self.model(data.task, batch).float().cpu()):
                        outputs[row] = out
                bar.advance(job)
        return torch.stack(outputs)


def probabilities(task: str, output: torch.Tensor) -> np.ndarray | None:
    """SST's probability of each class, Quora's of a paraphrase; None for STS's scores."""
    kind = TASKS[task].head_output
    if kind == "multiclass":
        return torch.softmax(output, -1).numpy()
    return torch.sigmoid(output).numpy() if kind == "binary" else None


def known_bad_rows(file: Path, params_file: Path = Path("params.yaml")) -> dict[str, str] | None:
    """The rows of a course file that ``params_file`` (in the working directory) lists as
    known to be broken (``data.skip_ids``), left out as the data stage leaves them out."""
    if not params_file.is_file():
        return None
    return read_params(params_file).get("data", {}).get("skip_ids", {}).get(Path(file).name)


def read_input(path: str | Path, task: str, skip_ids: dict[str, str] | None = None) -> pd.DataFrame:
    """A course file of ``task``, a plain CSV/TSV with named columns (told apart by the
    header), or a prepared table (``data/prepared/<task>-<split>.parquet``); ``skip_ids``
    as the data stage's."""
    path = Path(path)
    head = _head(path)
    if head.startswith(PARQUET_MAGIC):
        return _read_prepared(path, task)
    if b"\0" in head:
        raise ValueError(f"{path}: a binary file, not a text table (course, CSV, TSV) or Parquet")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A sample cut mid-character at its end still decodes up to there.
        if exc.start < len(head) - 4:
            raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}) nor a Parquet table") from None
    course = _is_course_file(head)
    return read_task_csv(path, TASKS[task], named=not course, skip_ids=skip_ids if course else None)


PARQUET_MAGIC = b"PAR1"


def _head(path: Path, size: int = 8192) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return b""  # let the reader report the file as missing or unreadable


def _read_prepared(path: Path, task: str) -> pd.DataFrame:
    """A prepared Parquet table of ``task``: its id, text and (when labelled) label columns."""
    spec = TASKS[task]
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several kinds for a damaged file
        raise ValueError(f"{path}: not a readable Parquet table ({exc.__class__.__name__}: {exc})") from None
    wanted = ["id", *spec.text_columns]
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{path}: no column {', '.join(map(repr, missing))}: not a prepared {task} table "
            f"(its columns: {', '.join(frame.columns)})"
        )
    keep = wanted + [c for c in ("label", "line") if c in frame.columns]
    return frame[keep].reset_index(drop=True)


def check_labels(frame: pd.DataFrame, task: str, source: str) -> str | None:
    """Refuse, before any prediction, a file with no labels or labels outside the task's
    range; a warning (or None) when the labels fit the range but not the task's shape
    (a two-class file scored as five-class SST, e.g. CFIMDB's)."""
    spec = TASKS[task]
    if "label" not in frame.columns:
        raise ValueError(f"{source}: no label column {spec.label_column!r}, so there is nothing to score")
    labels = frame["label"].to_numpy()
    if spec.label_kind == "class":
        bad = (labels < 0) | (labels >= spec.num_classes) | (labels != np.round(labels))
        allowed = f"the classes 0..{spec.num_classes - 1}"
    else:
        low, high = spec.score_range
        bad = (labels < low) | (labels > high)
        allowed = f"scores in [{low}, {high}]"
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        where = f"line {frame['line'].iloc[first]}" if "line" in frame.columns else f"row {first + 1}"
        raise ValueError(f"{source}: {where}: label {labels[first]!r} is not one of {allowed} of task {task}")
    used = set(np.unique(labels).tolist())
    if spec.label_kind == "class" and spec.num_classes > 2 and len(labels) >= 50 and len(used) <= 2:
        return (
            f"{source}: only labels {sorted(used)} in {len(labels)} rows, for {spec.num_classes}-class "
            f"{task}: is this a two-class file (CFIMDB's, say)? Its score is not {task}'s."
        )
    return None


def training_rows(model_dir: str | Path, frame: pd.DataFrame, task: str, source: str, allow: bool) -> str:
    """What to say about the rows of ``frame`` the model learned from or chose its
    epoch on (its directory's ``TRAINING_IDS``): their score is no held-out score, so
    they are an error naming the count unless ``allow``, then a warning."""
    ids_file = Path(model_dir) / TRAINING_IDS
    if not ids_file.is_file():
        return f"note: {model_dir} has no {TRAINING_IDS}: {source} was not checked against its training rows"
    try:
        ids = json.loads(gzip.decompress(ids_file.read_bytes()))["tasks"][task]
        seen = {str(i) for i in ids["trained"]} | {str(i) for i in ids["validation"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{ids_file}: not a record of {task}'s training rows ({exc!r})") from None
    shared = int(frame["id"].astype(str).isin(seen).sum())
    said = (
        f"{source}: {shared} of its {len(frame)} rows are {model_dir}'s training rows (trained or validation)"
    )
    if shared and not allow:
        raise ValueError(f"{said}, so its score is not held out; --allow-training-rows scores it anyway")
    return (
        f"warning: {said}; the score is not a held-out one"
        if shared
        else f"{source}: none of its rows are {model_dir}'s training rows"
    )


def _is_course_file(head: bytes) -> bool:
    """Whether a file starting with ``head`` is a course file: its header's first field is
    empty (or ``0``). An unreadable file (no bytes) counts as one, so that the course
    reader reports it as missing or unreadable."""
    first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace").lstrip("\ufeff")
    return first.split("\t", 1)[0] in ("", "0")


def texts_frame(task: str, texts: list[str] | None = None, pairs: list[tuple[str, str]] | None = None):
    """A frame of sentences given on the command line (ids ``text-1``, ``text-2``, ...)."""
    spec = TASKS[task]
    rows, other = (pairs, texts) if spec.is_pair else (texts, pairs)
    if not rows or other:
        kind = "--pair FIRST SECOND" if spec.is_pair else "--text SENTENCE"
        raise ValueError(
            f"task {task!r} takes {kind} (repeatable), not {'--text' if spec.is_pair else '--pair'}"
        )
    columns = {"id": [f"text-{i}" for i in range(1, len(rows) + 1)]}
    if spec.is_pair:
        columns.update(sentence1=[a for a, _ in rows], sentence2=[b for _, b in rows])
    else:
        columns["sentence"] = list(rows)
    for column in spec.text_columns:
        if any(not text.strip() for text in columns[column]):
            raise ValueError(f"{column} is empty: nothing to predict")
    return pd.DataFrame(columns)


def describe(task: str, prediction, probability=None) -> str:
    """A prediction as a person reads it, with its probability where the head gives one
    (SST: the two most probable classes)."""
    if task == "sst":
        label = f"{int(prediction)} ({SST_CLASSES[int(prediction)]})"
        if probability is None:
            return label
        second = int(np.argsort(-probability, kind="stable")[1])
        runner_up = f"next {second} ({SST_CLASSES[second]}) p={probability[second]:.2f}"
        return f"{label} p={probability[int(prediction)]:.2f}, {runner_up}"
    if task == "quora":
        label = f"{int(prediction)} ({'paraphrase' if int(prediction) else 'not a paraphrase'})"
        return label if probability is None else f"{label} P(paraphrase)={float(probability):.2f}"
    return f"{float(prediction):.3f} (similarity, 0-5)"


def shown(predicted: Predicted, frame: pd.DataFrame | None = None) -> list[str]:
    """One printed line per prediction: its id, or (``frame``: sentences given on the
    command line) its sentences after it, tab-separated."""
    lines = []
    probabilities = predicted.probabilities
    for n, (i, value) in enumerate(zip(predicted.ids, predicted.predictions)):
        said = describe(predicted.task, value, None if probabilities is None else probabilities[n])
        if frame is None:
            lines.append(f"{i}\t{said}")
        else:
            row = frame.loc[frame.id == i].iloc[0]
            lines.append(f"{said}\t{' | '.join(row[c] for c in TASKS[predicted.task].text_columns)}")
    return lines


def write(predicted: Predicted, out: Path) -> None:
    """The predictions in the course's submission format."""
    write_predictions(out, predicted.task, predicted.ids, predicted.predictions)


def score(predicted: Predicted) -> tuple[Interval, dict]:
    """The task's metric on a labelled file, with its 95% bootstrap interval, and the
    summary the command prints (and writes as JSON)."""
    if predicted.labels is None:
        column = TASKS[predicted.task].label_column
        raise ValueError(f"{predicted.source}: no label column {column!r}, so there is nothing to score")
    result = interval(predicted.task, predicted.labels, predicted.predictions)
    return result, {
        "file": predicted.source,
        "task": predicted.task,
        "metric": TASKS[predicted.task].metric_title,
        "value": result.value,
        "interval_95": [result.low, result.high],
        "examples": len(predicted.ids),
    }


def score_table(title: str, result: Interval, summary: dict):
    """:func:`score`'s result as a table for the terminal."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("task", "examples", "metric", "value", f"{CONFIDENCE:.0%} interval"):
        table.add_column(column)
    table.add_row(
        summary["task"],
        str(summary["examples"]),
        summary["metric"],
        f"{result.value:.4f}",
        f"[{result.low:.4f}, {result.high:.4f}]",
    )
    return table
