"""``params.yaml`` read as YAML 1.2 and checked, every key, before any work starts. A schema
maps a key to a type, a tuple of allowed names, a nested schema or ``[item]`` for a list
(``*``: any key; a ``Partial`` mapping's keys may be left out); an unknown key, a wrong
type or a name outside its registry is an error naming the key and what is allowed."""

from __future__ import annotations

import re
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
    elif isinstance(schema, tuple) and all(isinstance(s, str) for s in schema):
        if value not in schema:
            raise ParamsError(f"{source}: {key} = {value!r} is not one of {list(schema)}")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        # bool is an int in Python; a flag where a count belongs is still an error.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ParamsError(f"{source}: {key} must be {names}, got {value!r}")


DATA_SCHEMA = {
    "source": str,
    "allow_unverified": bool,
    "verify_checksums": bool,
    "quora_holdout_fraction": (int, float),
    "split_seed": int,
    "skip_ids": {"*": {"*": str}},
}


_NUMBER = (int, float)
_MAX_LENGTH = {task: int for task in TASKS}
_PER_MULTITASK_TASK = {task: int for task in MULTITASK_TASKS}
_PER_SENTIMENT_TASK = {task: int for task in SENTIMENT_TASKS}
# One optimizer's hyperparameters; lr_gamma is needed by the exponential schedule only.
_OPTIMIZER = Partial(
    {
        "lr": _NUMBER,
        "head_lr": _NUMBER,
        "lr_schedule": tuple(SCHEDULERS),
        "lr_gamma": _NUMBER,
        "weight_decay": _NUMBER,
    }
)
_SCALE = {
    "max_length": _MAX_LENGTH,
    "pooling": tuple(POOLINGS),
    "sentiment": {
        "batch_size": _PER_SENTIMENT_TASK,
        "dropout": _NUMBER,
        "max_tokens": int,
        "epochs": {mode: int for mode in SENTIMENT_MODES},
        "train_examples": _PER_SENTIMENT_TASK,
        "validation_examples": _PER_SENTIMENT_TASK,
        "head_lr": (int, float, type(None)),
    },
    "multitask": {
        "epochs": int,
        "dropout": _NUMBER,
        "batch_size": _PER_MULTITASK_TASK,
        "train_examples": _PER_MULTITASK_TASK,
        "validation_examples": _PER_MULTITASK_TASK,
        "carved_quora_batch": CARVED_QUORA_BATCH,
        "history_examples": {"dev": int, "train": int},
        "head_warmup": {"epochs": int, "lr": _NUMBER, "batch_size": int, "tasks": [tuple(MULTITASK_TASKS)]},
        "test_predictions": bool,
        "optimizers": {name: _OPTIMIZER for name in OPTIMIZERS},
        "lr_by_config": {"*": _NUMBER},  # names from `configs`, checked in validate()
    },
    "mlm": {"max_length": int, "epochs": int, "batch_size": int, "sequences": int},
}
_SMART = {
    "enabled": bool,
    "lambda_s": _NUMBER,
    "epsilon": _NUMBER,
    "noise_std": _NUMBER,
    "step_size": _NUMBER,
    "steps": int,
    "mu": _NUMBER,
    "beta": _NUMBER,
    "projection": PROJECTIONS,
    "token_norm": _NUMBER,
    "dropout_masks": DROPOUT_MASKS,
}
# The keys a configuration may override; their shared defaults sit at top level.
_CONFIG = {
    "optimizer": tuple(OPTIMIZERS),
    "paraphrase_head": tuple(n for n, tasks in PAIR_HEADS.items() if "quora" in tasks),
    "sts_head": tuple(n for n, tasks in PAIR_HEADS.items() if "sts" in tasks),
    "sts_output": STS_OUTPUTS,
    "gradient": GRADIENT_MODES,
    "batch_size_factor": int,
    "smart": _SMART,
}
SCHEMA: dict[str, Any] = {
    **_CONFIG,
    "configs": {"*": Partial({**_CONFIG, "smart": Partial(_SMART)})},
    "multitask": {
        "eval_batch_size": int,
        "grad_clip": _NUMBER,
        "compile": bool,
    },
    "zero_shot": {"quora_train_pairs": int},
    "seed_study": {"seeds": [int], "configs": [str], "jobs": int},
    "seed": int,
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
        "mask_prob": _NUMBER,
        "heldout_fraction": _NUMBER,
        "weight_decay": _NUMBER,
        "grad_clip": _NUMBER,
        "starts": {
            "continue": {"lr": _NUMBER},
            "scratch": {
                "lr": _NUMBER,
                "hidden_size": int,
                "num_hidden_layers": int,
                "num_attention_heads": int,
                "intermediate_size": int,
            },
        },
    },
    "sentiment": {
        "eval_batch_size": int,
        "weight_decay": _NUMBER,
        "optimizer": tuple(OPTIMIZERS),
        "lr_schedule": tuple(SCHEDULERS),
        "lr_gamma": _NUMBER,
        "grad_clip": _NUMBER,
        "runs": {"*": {"task": SENTIMENT_TASKS, "mode": SENTIMENT_MODES, "lr": _NUMBER}},
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
    for key in ("data.quora_holdout_fraction", "mlm.heldout_fraction", "mlm.mask_prob"):
        group, name = key.split(".")
        if not 0 < params[group][name] < 1:
            raise ParamsError(f"{source}: {key} must lie strictly between 0 and 1")
    for key in ("mlm.finetune", "seed_study.configs"):
        group, name = key.split(".")
        unknown = [c for c in params[group][name] if c not in params["configs"]]
        if unknown:
            raise ParamsError(
                f"{source}: {key} names {unknown}, which are not in configs: {sorted(params['configs'])}"
            )
    for name, scale_params in params["scales"].items():
        unknown = [c for c in scale_params["multitask"]["lr_by_config"] if c not in params["configs"]]
        if unknown:
            raise ParamsError(
                f"{source}: scales.{name}.multitask.lr_by_config names {unknown}, which are not in "
                f"configs: {sorted(params['configs'])}"
            )
        for optimizer, spec in scale_params["multitask"]["optimizers"].items():
            key = f"scales.{name}.multitask.optimizers.{optimizer}"
            missing = [k for k in ("lr", "head_lr", "lr_schedule", "weight_decay") if k not in spec]
            if spec.get("lr_schedule") == "exponential" and "lr_gamma" not in spec:
                missing.append("lr_gamma (the exponential schedule's factor per epoch)")
            if missing:
                raise ParamsError(f"{source}: {key} lacks {', '.join(missing)}")
    for name in ("", *params["configs"]):
        factor = config_values(params, name)["batch_size_factor"] if name else params["batch_size_factor"]
        if factor < 1:
            where = f"configs.{name}.batch_size_factor" if name else "batch_size_factor"
            raise ParamsError(f"{source}: {where} must be at least 1, got {factor}")
    if not params["mlm"]["sources"]:
        raise ParamsError(f"{source}: mlm.sources is empty; allowed: {list(MLM_SOURCES)}")
    return params


def config_values(params: dict, config: str) -> dict:
    """A configuration's effective choices: the top-level defaults, then its overrides."""
    configs = params["configs"]
    if config not in configs:
        raise ParamsError(f"configuration {config!r} is not one of {sorted(configs)}")
    overrides = configs[config] or {}
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
    fraction = params["data"]["quora_holdout_fraction"]
    if not 0 < fraction < 1:
        raise ParamsError(f"{path}: data.quora_holdout_fraction must lie strictly between 0 and 1")
    return params["data"]
