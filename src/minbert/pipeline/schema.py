"""``params.yaml`` read as YAML 1.2 and checked, every key, before any work starts (the
``resolve`` stage; ``minbert check-params``). A schema maps a key to a type, a ``Range`` for
a number, a tuple of allowed names, a nested schema or ``[item]`` for a list (``*``: any key;
a ``Partial`` mapping's keys may be left out); an unknown key, a wrong type, a number out of
its range or a name outside its registry is an error naming the key, the value and what is
allowed. Needs no torch: the data stage checks its own section (``load_data``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from minbert.results import RECORD_SUFFIX
from minbert.settings import (
    CARVED_QUORA_BATCH,
    DEVICES,
    DROPOUT_MASKS,
    GRADIENT_MODES,
    MLM_SOURCES,
    MLM_STARTS,
    OPTIMIZERS,
    PAIR_HEADS,
    POOLINGS,
    PROJECTIONS,
    SCHEDULERS,
    SENTIMENT_MODES,
    STS_OUTPUTS,
)
from minbert.tasks import MULTITASK_TASKS, SENTIMENT_TASKS, TASKS


class ParamsError(ValueError):
    pass


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2's floats: ``3e-05`` (what ``dvc exp run -S lr=3e-5`` writes)
    is a number, where PyYAML's YAML 1.1 rules read a string without a dot."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)


class Partial(dict):
    """A schema mapping whose keys may be left out (configuration overrides)."""


@dataclass(frozen=True)
class Range:
    """A finite number from ``low`` to ``high`` (None: no upper bound); an open end excludes
    its bound. ``integer``: a whole number (an int, never a bool); ``null``: may be empty."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    null: bool = False

    def types(self) -> tuple[type, ...]:
        return (int,) if self.integer else (int, float)

    def holds(self, value: float) -> bool:
        return (
            (isinstance(value, int) or math.isfinite(value))
            and (value > self.low if self.low_open else value >= self.low)
            and (self.high is None or (value < self.high if self.high_open else value <= self.high))
        )

    def __str__(self) -> str:
        what = "an integer" if self.integer else "a number"
        low, high = (f"{b:g}" if isinstance(b, float) else str(b) for b in (self.low, self.high))
        if self.high is None:
            text = f"{what} {'>' if self.low_open else '>='} {low}"
        else:
            text = f"{what} in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        return text + ", or empty (null)" * self.null


def check(value: Any, schema: Any, key: str, source: str) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ParamsError(f"{source}: {key} must be a mapping, got {value!r}")
        for k, v in value.items():
            sub = schema.get(k, schema.get("*"))
            if sub is None:
                raise ParamsError(
                    f"{source}: unknown key {f'{key}.{k}' if key else k!r}; "
                    f"allowed: {', '.join(sorted(schema))}"
                )
            check(v, sub, f"{key}.{k}" if key else str(k), source)
        missing = [] if isinstance(schema, Partial) else [k for k in schema if k != "*" and k not in value]
        if missing:
            raise ParamsError(f"{source}: {key or 'top level'} lacks {', '.join(missing)}")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise ParamsError(f"{source}: {key} must be a list, got {value!r}")
        if len(set(map(repr, value))) != len(value):
            raise ParamsError(f"{source}: {key} lists an entry twice: {value!r}")
        for i, item in enumerate(value):
            check(item, schema[0], f"{key}[{i}]", source)
    elif isinstance(schema, Range):
        if value is None and schema.null:
            return
        types = schema.types()
        if not isinstance(value, types) or isinstance(value, bool):
            names = " or ".join(t.__name__ for t in types)
            raise ParamsError(f"{source}: {key} must be {names}, got {value!r}")
        if not schema.holds(value):
            raise ParamsError(f"{source}: {key} = {value!r} is out of range; allowed: {schema}")
    elif isinstance(schema, tuple) and all(isinstance(s, str) for s in schema):
        if value not in schema:
            raise ParamsError(f"{source}: {key} = {value!r} is not one of {list(schema)}")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        # bool is an int in Python; a flag where a count belongs is still an error.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ParamsError(f"{source}: {key} must be {names}, got {value!r}")


# The ranges of the numbers.
_COUNT = Range(1, integer=True)  # epochs, batch sizes, layers: at least one
_SIZE = Range(0, integer=True)  # examples, sequences, tokens: 0 is "all" (or "no limit", "none")
_SEED = Range(0, 2**32 - 1, integer=True)
_LR = Range(0, 1, low_open=True)  # a learning rate
_GAMMA = Range(0, 1, low_open=True)  # the exponential schedule's factor per epoch
_WEIGHT = Range(0)  # a weight decay, a clipping norm, a loss weight: 0 switches it off
_POSITIVE = Range(0, low_open=True)
_FRACTION = Range(0, 1, low_open=True, high_open=True)
_DROPOUT = Range(0, 1, high_open=True)
# Room for [CLS] a [SEP] b [SEP] with a token each, up to BERT's 512 positions.
_MAX_LENGTH = Range(5, 512, integer=True)

DATA_SCHEMA = {
    "source": str,
    "allow_unverified": bool,
    "verify_checksums": bool,
    "quora_holdout_fraction": _FRACTION,
    "split_seed": _SEED,
    "skip_ids": {"*": {"*": str}},
}


_PER_MULTITASK_TASK = {task: _COUNT for task in MULTITASK_TASKS}
_SIZE_PER_MULTITASK_TASK = {task: _SIZE for task in MULTITASK_TASKS}
_PER_SENTIMENT_TASK = {task: _COUNT for task in SENTIMENT_TASKS}
# One optimizer's hyperparameters; lr_gamma is needed by the exponential schedule only.
_OPTIMIZER = Partial(
    {
        "lr": _LR,
        "head_lr": _LR,
        "lr_schedule": tuple(SCHEDULERS),
        "lr_gamma": _GAMMA,
        "weight_decay": _WEIGHT,
    }
)
_SCALE = {
    "max_length": {task: _MAX_LENGTH for task in TASKS},
    "pooling": tuple(POOLINGS),
    "sentiment": {
        "batch_size": _PER_SENTIMENT_TASK,
        "dropout": _DROPOUT,
        "max_tokens": _SIZE,
        "epochs": {mode: _COUNT for mode in SENTIMENT_MODES},
        # Stop after this many epochs in a row no better on validation (0: run every epoch).
        "patience": {mode: _SIZE for mode in SENTIMENT_MODES},
        "train_examples": {task: _SIZE for task in SENTIMENT_TASKS},
        "validation_examples": _PER_SENTIMENT_TASK,
        "head_lr": Range(0, 1, low_open=True, null=True),  # null: the run's own lr
    },
    "multitask": {
        "eval_batch_size": _COUNT,
        "epochs": _COUNT,
        "dropout": _DROPOUT,
        "batch_size": _PER_MULTITASK_TASK,
        "train_examples": _SIZE_PER_MULTITASK_TASK,
        "validation_examples": _PER_MULTITASK_TASK,
        "carved_quora_batch": CARVED_QUORA_BATCH,
        "history_examples": {"dev": _SIZE, "train": _SIZE},
        "head_warmup": {
            "epochs": _SIZE,  # 0: no warm-up
            "lr": _LR,
            "batch_size": _COUNT,
            "tasks": [tuple(MULTITASK_TASKS)],
        },
        "test_predictions": bool,
        "optimizers": {name: _OPTIMIZER for name in OPTIMIZERS},
    },
    "mlm": {"max_length": _MAX_LENGTH, "epochs": _COUNT, "batch_size": _COUNT, "sequences": _SIZE},
}
_SMART = {
    "enabled": bool,
    "lambda_s": _WEIGHT,
    "epsilon": _POSITIVE,
    # A zero start sits at the divergence's minimum, where its gradient is zero: the
    # ascent would never move.
    "noise_std": _POSITIVE,
    "step_size": _POSITIVE,
    "steps": _COUNT,
    "mu": _WEIGHT,
    "beta": Range(0, 1, high_open=True),  # 1 would freeze the teacher at its start
    "projection": PROJECTIONS,
    "token_norm": _POSITIVE,
    "dropout_masks": DROPOUT_MASKS,
}
# The keys a configuration may override; their shared defaults sit at top level.
_CONFIG = {
    "optimizer": tuple(OPTIMIZERS),
    "paraphrase_head": tuple(n for n, tasks in PAIR_HEADS.items() if "quora" in tasks),
    "sts_head": tuple(n for n, tasks in PAIR_HEADS.items() if "sts" in tasks),
    "sts_output": STS_OUTPUTS,
    "gradient": GRADIENT_MODES,
    "batch_size_factor": _COUNT,
    "smart": _SMART,
}
SCHEMA: dict[str, Any] = {
    **_CONFIG,
    "configs": {"*": Partial({**_CONFIG, "smart": Partial(_SMART)})},
    "multitask": {
        "grad_clip": _WEIGHT,
        "compile": bool,
    },
    "zero_shot": {"quora_train_pairs": _SIZE},
    "seed_study": {"seeds": [_SEED], "configs": [str], "jobs": _COUNT},
    "seed": _SEED,
    "device": DEVICES,
    "launcher": str,  # checked in validate()
    "checkpoint": str,
    "scale": str,  # checked against the keys of `scales` below
    "data": DATA_SCHEMA,
    "scales": {"*": _SCALE},
    "mlm": {
        "pretrain": [MLM_STARTS],
        "finetune": [str],  # names from `configs`, checked in validate()
        "sources": [MLM_SOURCES],
        "mask_prob": _FRACTION,
        "heldout_fraction": _FRACTION,
        "weight_decay": _WEIGHT,
        "grad_clip": _WEIGHT,
        "starts": {
            "continue": {"lr": _LR},
            "scratch": {
                "lr": _LR,
                "hidden_size": _COUNT,
                "num_hidden_layers": _COUNT,
                "num_attention_heads": _COUNT,
                "intermediate_size": _COUNT,
            },
        },
    },
    "sentiment": {
        "eval_batch_size": _COUNT,
        "weight_decay": _WEIGHT,
        "optimizer": tuple(OPTIMIZERS),
        "lr_schedule": tuple(SCHEDULERS),
        "lr_gamma": _GAMMA,
        "grad_clip": _WEIGHT,
        "runs": {"*": {"task": SENTIMENT_TASKS, "mode": SENTIMENT_MODES, "lr": _LR}},
    },
}


# A run's name becomes a DVC stage name and file names (``<name>.json``, and its record
# ``<name>-run.json``, minbert.results): no name may be another's record.
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def validate(params: dict, source: str = "params.yaml") -> dict:
    check(params, SCHEMA, "", source)
    for group, names in (("configs", params["configs"]), ("sentiment.runs", params["sentiment"]["runs"])):
        for name in names:
            if not _RUN_NAME.match(str(name)) or str(name).endswith(RECORD_SUFFIX[: -len(".json")]):
                raise ParamsError(
                    f"{source}: {group}.{name}: a run's name must be letters, digits, '-' and '_' "
                    f"and must not end in '{RECORD_SUFFIX[: -len('.json')]}' (it names its files)"
                )
    if params["scale"] not in params["scales"]:
        raise ParamsError(f"{source}: scale = {params['scale']!r} is not one of {sorted(params['scales'])}")
    if params["launcher"].split()[:1] not in (["python"], ["torchrun"]):
        raise ParamsError(
            f"{source}: launcher = {params['launcher']!r} must be 'python' or a "
            "'torchrun ...' command line (e.g. 'torchrun --standalone --nproc_per_node 4')"
        )
    for key in ("mlm.finetune", "seed_study.configs"):
        group, name = key.split(".")
        unknown = [c for c in params[group][name] if c not in params["configs"]]
        if unknown:
            raise ParamsError(
                f"{source}: {key} names {unknown}, which are not in configs: {sorted(params['configs'])}"
            )
    for name, scale_params in params["scales"].items():
        for optimizer, spec in scale_params["multitask"]["optimizers"].items():
            key = f"scales.{name}.multitask.optimizers.{optimizer}"
            missing = [k for k in ("lr", "head_lr", "lr_schedule", "weight_decay") if k not in spec]
            if spec.get("lr_schedule") == "exponential" and "lr_gamma" not in spec:
                missing.append("lr_gamma (the exponential schedule's factor per epoch)")
            if missing:
                raise ParamsError(f"{source}: {key} lacks {', '.join(missing)}")
    if not params["mlm"]["sources"]:
        raise ParamsError(f"{source}: mlm.sources is empty; allowed: {list(MLM_SOURCES)}")
    return params


def config_values(params: dict, config: str | None) -> dict:
    """A configuration's effective choices: the top-level defaults, then its overrides
    (``None``: the defaults alone)."""
    configs = params["configs"]
    if config is not None and config not in configs:
        raise ParamsError(f"configuration {config!r} is not one of {sorted(configs)}")
    overrides = (configs[config] if config is not None else None) or {}
    values = {key: params[key] for key in _CONFIG}
    values.update({k: v for k, v in overrides.items() if k != "smart"})
    values["smart"] = {**params["smart"], **overrides.get("smart", {})}
    return values


def read(path: str | Path = "params.yaml") -> dict:
    """The parameters file as a mapping, or a ParamsError naming the file and the reason."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such parameters file (run from the repository root)") from None
    try:
        params = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    if params is not None and not isinstance(params, dict):
        raise ParamsError(f"{path}: the top level must be a mapping of keys, got {type(params).__name__}")
    return params or {}


def load_data(path: str | Path = "params.yaml") -> dict:
    """The ``data`` section, checked (the data stage's parameters)."""
    params = read(path)
    if "data" not in params:
        raise ParamsError(f"{path}: top level lacks data")
    check(params["data"], DATA_SCHEMA, "data", str(path))
    return params["data"]
