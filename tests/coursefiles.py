"""Course-shaped CSV files for tests, written in the course's own layouts."""

from __future__ import annotations

import csv
import io

from minbert.tasks import TASKS

# The Quora files whose checksum is not pinned (absent from the shared data).
UNVERIFIED = ("quora-train.csv", "quora-test-student.csv")


def course_files(
    rows: int = 20,
    *,
    unverified_too: bool = False,
    quora_dev_rows: int | None = None,
    broken_quora_id: str | None = None,
) -> dict[str, bytes]:
    """A small but complete set of course files, in the course's own layouts.

    quora-dev.csv gets `quora_dev_rows` good pairs (default `rows`), plus one
    unlabelled row with id `broken_quora_id` when given, like the two broken rows
    of the real file."""
    files = {}
    for task in TASKS.values():
        for split, name in task.files.items():
            if name in UNVERIFIED and not unverified_too:
                continue
            labelled = split != "test"
            two_index = split == "test" and not task.is_pair  # as in the sst/cfimdb test files
            out = io.StringIO()
            writer = csv.writer(out, delimiter="\t", lineterminator="\n")
            index_columns = ["0", ""] if two_index else [""]
            label_column = [task.label_column] if labelled else []
            writer.writerow([*index_columns, "id", *task.text_columns, *label_column])
            n = quora_dev_rows if name == "quora-dev.csv" and quora_dev_rows else rows
            for i in range(n):
                index = [i + 1, f"{i}.0"] if two_index else [i]
                texts = [f' {task.name} {split} "{i}" part {k}' for k in range(len(task.text_columns))]
                if task.name == "quora":
                    label = f"{i % 2}.0"
                elif task.label_kind == "class":
                    label = str(i % task.num_classes)
                else:
                    label = f"{(i % 11) / 2:.1f}"
                writer.writerow([*index, f"{split}-{i:04d}", *texts, *([label] if labelled else [])])
            if name == "quora-dev.csv" and broken_quora_id:
                writer.writerow([n, broken_quora_id, "Is this broken?", "Yes.", ""])
            files[name] = out.getvalue().encode()
    return files
