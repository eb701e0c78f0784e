"""The studies' files (seed study, learning-rate search, MLM study, the runs outside
`dvc repro`), typed for their
readers; a file that lacks a key is named with the command that rewrites it."""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from minbert.tasks import AVERAGE, MULTITASK_TASKS

SCORE_KEYS = (*MULTITASK_TASKS, AVERAGE)
# The studies' files under metrics/ (`minbert lr-search`, `minbert seed-study` write them; the
# report reads them).
LR_SEARCH_FILE = "lr-search.json"
SEED_STUDY_FILE = "seed-study.json"
# `minbert extra-runs`: its record, and the folder of its runs' dev predictions.
EXTRA_RUNS_FILE = "extra-runs.json"
EXTRA_RUNS_DIR = "extra-runs"


def _load(path: Path) -> dict | None:
    path = Path(path)
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path}: not a JSON object")
    return content


def _require(where: str, values: dict, kind: type, rerun: str) -> None:
    required = [f.name for f in fields(kind) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in values]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}: written by an older `{rerun}`; rerun it")


def _checked(path: Path, kind: type, rerun: str, part: str | None = None) -> dict | None:
    """``path``'s content (None when there is no such file), its ``part`` (a bench record's
    ``results``) or the whole holding every field ``kind`` requires."""
    values = _load(path)
    if values is not None:
        where, checked = (f"{path}: {part}", values.get(part, {})) if part else (str(path), values)
        _require(where, checked, kind, rerun)
    return values


@dataclass(frozen=True)
class SeedRun:
    """One seed's run of a configuration: its experiment's name, its dev scores, and the
    commit whose code it ran and the device it ran on ("": a study written before they
    were recorded)."""

    seed: int
    run: str
    scores: dict[str, float]
    code: str = ""
    device: str = ""


@dataclass(frozen=True)
class SeedStudyFile:
    """``metrics/seed-study.json``: each configuration trained with other seeds."""

    command: str
    how: str
    seeds: list[int]
    configs: dict[str, list[SeedRun]]
    # Each configuration's settings digest (``minbert.report.comparisons.settings_digest``).
    settings: dict[str, str] = field(default_factory=dict)
    settings_note: str | None = None


def read_seed_study(path: Path) -> SeedStudyFile | None:
    values = _checked(path, SeedStudyFile, "minbert seed-study")
    if values is None:
        return None
    configs = {
        config: [
            SeedRun(
                r["seed"], r["run"], {k: r[k] for k in SCORE_KEYS}, r.get("code", ""), r.get("device", "")
            )
            for r in rows
        ]
        for config, rows in values["configs"].items()
    }
    return SeedStudyFile(**{**values, "configs": configs})


@dataclass(frozen=True)
class MlmStudyFile:
    """``metrics/mlm-study/study.json``: the MLM study's experiment and the metrics of each
    configuration it was compared with, then."""

    command: str
    experiment: str
    experiment_commit: str
    how: str
    compared_with: dict[str, dict[str, float]]
    # Each stage's dvc.lock entry in the experiment ("mlm@<start>", "multitask-mlm@<start>-<config>").
    stages: dict[str, dict] = field(default_factory=dict)


def read_mlm_study(path: Path) -> MlmStudyFile | None:
    values = _checked(path, MlmStudyFile, "minbert mlm-study")
    if values is None:
        return None
    return MlmStudyFile(**values)


@dataclass(frozen=True)
class ExtraRunsFile:
    """``metrics/extra-runs.json``: where the runs `dvc repro` leaves out came from."""

    command: str
    experiment: str  # its name, or "commit <sha>" where a commit's `dvc repro` ran them
    experiment_commit: str
    how: str
    stages: dict[str, dict]  # "multitask@<config>" -> its dvc.lock entry


def read_extra_runs(path: Path) -> ExtraRunsFile | None:
    values = _checked(path, ExtraRunsFile, "minbert extra-runs")
    return None if values is None else ExtraRunsFile(**values)


@dataclass(frozen=True)
class VariantRun:
    """One seed's run of a variant in ``bench/smart_collapse.py``: the epoch it kept, the
    validation Quora MCC and selection score by epoch (0: its start), and the first epoch's
    mean gradient norms on the Quora head per term (loss, adversarial, bregman)."""

    seed: int
    best_epoch: int
    quora_mcc: list[float]
    selection: list[float]
    first_epoch_quora_gradient: dict[str, float]


@dataclass(frozen=True)
class SmartVariant:
    """A change to the runs' settings (``change``; empty: the control) with the SMART
    settings it ran, and its runs, one per seed."""

    change: dict
    smart: dict
    runs: list[VariantRun]


@dataclass(frozen=True)
class SmartMeasurement:
    """``bench/results/smart_collapse.json``: one configuration trained per variant of its
    settings and seed on the validation split, departing from the settings in ``ran_at``
    (a run record's form, the seed apart)."""

    config: str
    steps: int
    lr: float
    seeds: list[int]
    ran_at: dict
    variants: dict[str, SmartVariant]

    @property
    def control(self) -> SmartVariant | None:
        """The variant that changes nothing: the runs' own settings."""
        return next((v for v in self.variants.values() if not v.change), None)


def read_smart_measurement(path: Path) -> SmartMeasurement | None:
    values = _checked(path, SmartMeasurement, "python bench/smart_collapse.py", "results")
    if values is None:
        return None
    found = values["results"]

    def run(r: dict) -> VariantRun:
        epochs = r["epochs"]
        return VariantRun(
            r["seed"],
            r["best_epoch"],
            [e["validation"]["quora_mcc"] for e in epochs],
            [e["validation"]["selection"] for e in epochs],
            epochs[1]["head_gradient_quora"],
        )

    variants = {
        name: SmartVariant(v["change"], v["smart"], [run(r) for r in v["runs"]])
        for name, v in found["variants"].items()
    }
    kept = {k: found[k] for k in ("config", "steps", "lr", "seeds", "ran_at")}
    return SmartMeasurement(variants=variants, **kept)


@dataclass(frozen=True)
class NormPoint:
    """One run of ``bench/smart_norm.py``: a norm and seed, the epoch it kept and the
    validation selection score there and at its start (epoch 0)."""

    token_norm: float
    seed: int
    best_epoch: int
    start_selection: float
    selection: float

    @classmethod
    def of(cls, values: dict) -> NormPoint:
        """A point from the bench's record of it (which holds more than the report reads)."""
        return cls(**{f.name: values[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class SmartNormSearch:
    """``bench/results/smart_norm.json``: SMART's per-token norm chosen on validation over
    seeds, with the settings its runs ran at (``ran_at``: a run record's form, the norm and
    seed apart, the example counts only where every run realised the same)."""

    config: str
    rule: str
    chosen: float
    points: list[NormPoint]
    ran_at: dict


def norm_apart(at: dict) -> dict:
    """Settings in a run record's form (``ran_at``) less SMART's per-token norm: what a norm
    search's runs share with each other and with the run whose norm it chooses."""
    smart = {k: v for k, v in at["smart"].items() if k != "token_norm"}
    return {**at, "smart": smart}


def read_smart_norm_search(path: Path) -> SmartNormSearch | None:
    values = _checked(path, SmartNormSearch, "python bench/smart_norm.py", "results")
    if values is None:
        return None
    found = values["results"]
    points = [NormPoint.of(p) for p in found["points"]]
    kept = {k: found[k] for k in ("config", "rule", "chosen", "ran_at")}
    return SmartNormSearch(points=points, **kept)


@dataclass(frozen=True)
class CappedStart:
    """One start of ``bench/warmup_cap.py`` at one seed, per pass cap: each fit's pass kept
    and validation loss there, the start's validation selection score and the warm-up's
    seconds."""

    configs: list[str]
    seed: int
    kept: dict[int, dict[str, int]]
    loss: dict[int, dict[str, float]]
    selection: dict[int, float]
    seconds: dict[int, float]

    @classmethod
    def of(cls, values: dict) -> CappedStart:
        """A start from the bench's record of it (its fits by cap, as JSON keys)."""
        fits = {int(cap): fit for cap, fit in values["fits"].items()}

        def each(key: str) -> dict[int, dict]:
            return {cap: {t: w[key] for t, w in fit["warmup"].items()} for cap, fit in fits.items()}

        return cls(
            configs=values["configs"],
            seed=values["seed"],
            kept=each("epochs_kept"),
            loss=each("validation_loss_after"),
            selection={cap: fit["validation"]["selection"] for cap, fit in fits.items()},
            seconds={cap: fit["warmup_seconds"] for cap, fit in fits.items()},
        )


@dataclass(frozen=True)
class WarmupCapStudy:
    """``bench/results/warmup_cap.json``: the starts' heads fitted at the committed pass cap
    and at a longer one, over seeds (validation only)."""

    committed_cap: int
    cap: int
    seeds: list[int]
    starts: list[CappedStart]
    problems: list[str]  # where the committed cap at the tables' seed departed from the stages
    started: str = ""  # when the bench ran (its record's own field, beside the results)

    def start_of(self, config: str, seed: int) -> CappedStart | None:
        """The start ``config`` shares at ``seed``; None where it was not measured."""
        return next((s for s in self.starts if config in s.configs and s.seed == seed), None)


def read_warmup_cap(path: Path) -> WarmupCapStudy | None:
    values = _checked(path, WarmupCapStudy, "python bench/warmup_cap.py", "results")
    if values is None:
        return None
    found = values["results"]
    return WarmupCapStudy(
        committed_cap=found["committed_cap"],
        cap=found["cap"],
        seeds=found["seeds"],
        starts=[CappedStart.of(s) for s in found["starts"]],
        problems=found["problems"],
        started=values.get("started", ""),
    )


@dataclass(frozen=True)
class FamilyPoint:
    """One run of a family's search (``minbert lr-search``), scored on validation."""

    scale: str
    family: str
    config: str
    optimizer: str
    lr: float
    head_lr: float
    seed: int
    experiment: str
    best_epoch: int
    validation_selection: float
    validation_per_epoch: list[float]
    ran_at: dict  # the settings it ran at, in a run record's form, the rates and seed apart


@dataclass(frozen=True)
class RateMean:
    """A rate's mean over ``seeds``; the chosen rate's paired difference from it (mean,
    low, high; None for the chosen rate, or from fewer than three seeds)."""

    lr: float
    seeds: list[int]
    mean: float
    chosen_minus: list[float] | None


@dataclass(frozen=True)
class FamilyChoice:
    """A family's rate for one optimizer and scale, its interval over the seeds."""

    scale: str
    family: str
    optimizer: str
    lr: float
    interval: list[float] | None
    grid: list[RateMean]
    members: list[str] = field(default_factory=list)  # the family's configurations with this optimizer


@dataclass(frozen=True)
class FamilySearchFile:
    """``metrics/lr-search.json``: every family's search runs and choices."""

    command: str
    how: str
    points: list[FamilyPoint]
    chosen: list[FamilyChoice]


def write_family_search(study: FamilySearchFile, path: Path) -> None:
    from dataclasses import asdict

    from minbert.atomic import atomic_write_text

    atomic_write_text(Path(path), json.dumps(asdict(study), indent=2) + "\n")


def read_family_search(path: Path) -> FamilySearchFile | None:
    values = _checked(path, FamilySearchFile, "minbert lr-search FAMILY")
    if values is None:
        return None
    where = str(path)
    for p in values["points"]:
        _require(f"{where}: a point", p, FamilyPoint, "minbert lr-search FAMILY")
    chosen = [FamilyChoice(**{**c, "grid": [RateMean(**g) for g in c["grid"]]}) for c in values["chosen"]]
    return FamilySearchFile(
        command=values["command"],
        how=values["how"],
        points=[FamilyPoint(**p) for p in values["points"]],
        chosen=chosen,
    )
