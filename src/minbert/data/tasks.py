"""The four course tasks and the layout of their CSV files.

Everything the input layer needs to know about a task lives in one `TaskSpec`,
so the reader, the downloader and the prepare step never hard-code a column or
a file name of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

#: The splits every task has. "test" files carry no labels.
SPLITS: tuple[str, ...] = ("train", "dev", "test")


@dataclass(frozen=True)
class TaskSpec:
    """How one task is stored in the course files and what its labels mean.

    The text and label column names are the ones in the source files; the
    reader keeps the text column names as they are (so a pair task yields
    ``sentence1``/``sentence2``) and renames the label column to ``label``.
    """

    name: str
    #: ``("sentence",)`` for single-sentence tasks, ``("sentence1", "sentence2")`` for pairs.
    text_columns: tuple[str, ...]
    #: Column holding the label in the labelled (train/dev) files.
    label_column: str
    #: "class": integer classes 0..num_classes-1; "score": a real number in score_range.
    label_kind: Literal["class", "score"]
    #: Course file name of each split ("train", "dev", "test"). Left out of the
    #: hash because a mapping is not hashable; the names still take part in ==.
    files: Mapping[str, str] = field(hash=False)
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
        # A read-only view, so a frozen spec cannot be changed through its dict.
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))

    @property
    def is_pair(self) -> bool:
        """True for sentence-pair tasks (Quora, STS)."""
        return len(self.text_columns) == 2


def _spec(name: str, text: tuple[str, ...], label: str, files: tuple[str, str, str], **labels) -> TaskSpec:
    # Split file names are given in SPLITS order to keep the table below compact.
    return TaskSpec(
        name=name,
        text_columns=text,
        label_column=label,
        files=dict(zip(SPLITS, files)),
        **labels,
    )


TASKS: dict[str, TaskSpec] = {
    "sst": _spec(
        "sst",
        ("sentence",),
        "sentiment",
        ("ids-sst-train.csv", "ids-sst-dev.csv", "ids-sst-test-student.csv"),
        label_kind="class",
        num_classes=5,
    ),
    "cfimdb": _spec(
        "cfimdb",
        ("sentence",),
        "sentiment",
        ("ids-cfimdb-train.csv", "ids-cfimdb-dev.csv", "ids-cfimdb-test-student.csv"),
        label_kind="class",
        num_classes=2,
    ),
    "quora": _spec(
        "quora",
        ("sentence1", "sentence2"),
        "is_duplicate",
        ("quora-train.csv", "quora-dev.csv", "quora-test-student.csv"),
        label_kind="class",
        num_classes=2,
    ),
    "sts": _spec(
        "sts",
        ("sentence1", "sentence2"),
        "similarity",
        ("sts-train.csv", "sts-dev.csv", "sts-test-student.csv"),
        label_kind="score",
        score_range=(0.0, 5.0),
    ),
}
