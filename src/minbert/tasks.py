"""The four course tasks, one ``TaskSpec`` each: the single place every layer reads a task
from (its files and columns, labels, head output and so its loss and SMART's divergence,
metric, and names)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

#: The splits every task has. "test" files carry no labels.
SPLITS: tuple[str, ...] = ("train", "dev", "test")

#: What a task head outputs, and what follows from it: the training loss, the
#: prediction written to a course file, and the divergence SMART compares two outputs by.
HEAD_OUTPUTS: dict[str, str] = {
    "multiclass": "logits over the classes; cross-entropy; the argmax; symmetric KL of the softmaxes",
    "binary": "one logit; binary cross-entropy; logit > 0; symmetric KL of the two-class distributions",
    "regression": "a score; squared error; the score; squared error",
}


@dataclass(frozen=True)
class TaskSpec:
    """One task: its storage (the source files' column names; the label column is read as
    ``label``), labels, head output, metric and names."""

    name: str
    #: How tables and prose name it ("SST"), and where its data comes from.
    title: str
    source: str
    #: ``("sentence",)`` for single-sentence tasks, ``("sentence1", "sentence2")`` for pairs.
    text_columns: tuple[str, ...]
    #: Column holding the label in the labelled (train/dev) files.
    label_column: str
    #: "class": integer classes 0..num_classes-1; "score": a real number in score_range.
    label_kind: Literal["class", "score"]
    #: Course file name of each split ("train", "dev", "test"). Left out of the
    #: hash because a mapping is not hashable; the names still take part in ==.
    files: Mapping[str, str] = field(hash=False)
    #: A key of ``HEAD_OUTPUTS``.
    head_output: str = "multiclass"
    num_classes: int | None = None
    score_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        # Catch an inconsistent spec at import time rather than as a confusing
        # error deep inside the reader.
        if self.label_kind == "class":
            if self.num_classes is None or self.num_classes < 2 or self.score_range is not None:
                raise ValueError(f"task {self.name}: a class task needs num_classes >= 2 and no score_range")
        elif self.label_kind == "score":
            if self.score_range is None or self.num_classes is not None:
                raise ValueError(f"task {self.name}: a score task needs score_range and no num_classes")
            low, high = self.score_range
            if not low < high:
                raise ValueError(f"task {self.name}: empty score_range {self.score_range}")
        else:
            raise ValueError(f"task {self.name}: unknown label_kind {self.label_kind!r}")
        if set(self.files) != set(SPLITS):
            raise ValueError(f"task {self.name}: files must name exactly the splits {SPLITS}")
        if self.text_columns not in (("sentence",), ("sentence1", "sentence2")):
            raise ValueError(f"task {self.name}: unsupported text columns {self.text_columns}")
        if self.head_output not in HEAD_OUTPUTS:
            raise ValueError(f"task {self.name}: head_output must be one of {list(HEAD_OUTPUTS)}")
        if (self.head_output == "regression") != (self.label_kind == "score"):
            raise ValueError(f"task {self.name}: a regression head goes with score labels, and only then")
        # A read-only view, so a frozen spec cannot be changed through its dict.
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))

    @property
    def is_pair(self) -> bool:
        """True for sentence-pair tasks (Quora, STS)."""
        return len(self.text_columns) == 2

    @property
    def metric(self) -> str:
        """Accuracy for classes, Pearson's r for scores (``minbert.metrics.score``)."""
        return "accuracy" if self.label_kind == "class" else "pearson"

    @property
    def metric_key(self) -> str:
        """The metric's name in history columns and scores: ``sst_accuracy``."""
        return f"{self.name}_{self.metric}"

    @property
    def selection_metric(self) -> str:
        """The chance-corrected score that chooses epochs and learning rates: Matthews'
        correlation for classes, Pearson's r for scores. A constant answer scores 0 on
        both, where it can score high on accuracy (Quora's always-not-duplicate: 0.63)."""
        return "mcc" if self.label_kind == "class" else "pearson"

    @property
    def loss_key(self) -> str:
        """The loss's name in scores and history columns: ``loss_sst``."""
        return f"loss_{self.name}"

    @property
    def selection_key(self) -> str:
        """The selection metric's name in history columns and records: ``quora_mcc``."""
        return f"{self.name}_{self.selection_metric}"

    @property
    def selection_title(self) -> str:
        """The selection metric's title in prose and tables: ``Quora MCC``."""
        return f"{self.title} {'MCC' if self.selection_metric == 'mcc' else 'Pearson'}"

    @property
    def metric_title(self) -> str:
        """The metric's column title in tables: ``SST acc``, ``STS Pearson``."""
        return f"{self.title} {'acc' if self.metric == 'accuracy' else 'Pearson'}"


def _files(stem: str) -> dict[str, str]:
    """The course's file names of a task: ``<stem>-train.csv``, ``-dev.csv``, ``-test-student.csv``."""
    return {"train": f"{stem}-train.csv", "dev": f"{stem}-dev.csv", "test": f"{stem}-test-student.csv"}


_SENTENCE, _PAIR = ("sentence",), ("sentence1", "sentence2")
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("sst", "SST", "the Stanford Sentiment Treebank", _SENTENCE, "sentiment", "class",
                 _files("ids-sst"), num_classes=5),
        TaskSpec("cfimdb", "CFIMDB", "IMDB reviews", _SENTENCE, "sentiment", "class",
                 _files("ids-cfimdb"), num_classes=2),
        TaskSpec("quora", "Quora", "the Quora question-pairs release", _PAIR, "is_duplicate", "class",
                 _files("quora"), head_output="binary", num_classes=2),
        TaskSpec("sts", "STS", "the STS benchmark", _PAIR, "similarity", "score",
                 _files("sts"), head_output="regression", score_range=(0.0, 5.0)),
    )
}  # fmt: skip
#: The tasks of multitask fine-tuning, in the order every table and history file uses,
#: the key of the plain mean of their metrics (the paper's average), and the key of the
#: mean of their selection metrics (chance-corrected: what chooses epochs and rates).
MULTITASK_TASKS: tuple[str, ...] = ("sst", "quora", "sts")
AVERAGE = "average"
SELECTION = "selection"
#: The tasks of single-task sentiment classification (the paper's Table 1).
SENTIMENT_TASKS: tuple[str, ...] = ("sst", "cfimdb")
