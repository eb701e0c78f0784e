"""Every run's and study's files, typed for their readers (``training``: the stages' runs;
``study_files``: the seed study, the learning-rate search, the MLM study, the SMART
measurement; ``gpu_calls``: the GPU study's provenance). Torch-free."""

from minbert.runs.study_files import (
    LrSearchFile,
    MlmStudyFile,
    SearchChoice,
    SearchPoint,
    SeedRun,
    SeedStudyFile,
    SmartMeasurement,
    SmartVariant,
    read_lr_search,
    read_mlm_study,
    read_seed_study,
    read_smart_measurement,
    smart_measurement,
)
from minbert.runs.training import (
    STATED_APART,
    Checkpoint,
    DataSplit,
    MlmRunFile,
    MultitaskRunFile,
    RecordedSettings,
    SentimentRunFile,
    ZeroShotRunFile,
    multitask_run,
    read_run,
    read_runs,
)

__all__ = [
    "STATED_APART",
    "Checkpoint",
    "DataSplit",
    "LrSearchFile",
    "MlmRunFile",
    "MlmStudyFile",
    "MultitaskRunFile",
    "RecordedSettings",
    "SearchChoice",
    "SearchPoint",
    "SeedRun",
    "SeedStudyFile",
    "SentimentRunFile",
    "SmartMeasurement",
    "SmartVariant",
    "ZeroShotRunFile",
    "multitask_run",
    "read_lr_search",
    "read_mlm_study",
    "read_run",
    "read_runs",
    "read_seed_study",
    "read_smart_measurement",
    "smart_measurement",
]
