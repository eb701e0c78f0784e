"""The input layer: the course CSV files, read strictly, turned into Parquet tables.

`tasks` describes the four tasks and their files, `csvfile` reads and validates
one file, `download` fetches the files at a pinned commit, and `prepare` is the
pipeline's data stage that ties them together.
"""

from .csvfile import DataError, Problem, read_task_csv, validate_task_csv
from .download import COURSE_SHA256, DownloadError, fetch, sha256_file
from .prepare import prepare, resolve_source
from .tasks import SPLITS, TASKS, TaskSpec

__all__ = [
    "COURSE_SHA256",
    "SPLITS",
    "TASKS",
    "DataError",
    "DownloadError",
    "Problem",
    "TaskSpec",
    "fetch",
    "prepare",
    "read_task_csv",
    "resolve_source",
    "sha256_file",
    "validate_task_csv",
]
