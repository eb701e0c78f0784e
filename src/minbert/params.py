"""Reading and checking ``params.yaml``.

Every key is checked against the schema below before any work starts: an unknown
key, a value of the wrong type, or a name outside its registry is an error naming
the key and what is allowed. A typo in an ablation (``optimiser: adamaxw``) must
fail loudly, not silently run the default.
"""

from __future__ import annotations

from pathlib import Path
import re
from typing import Any

import yaml

from minbert.data.corpus import SOURCES as CORPUS_SOURCES
from minbert.data.tasks import TASKS
from minbert.model.heads import PAIR_HEADS, POOLINGS, STS_OUTPUTS
from minbert.train.device import DEVICES
from minbert.train.mlm import STARTS as MLM_STARTS
from minbert.train.mlm import MlmSettings
from minbert.train.multitask import GRADIENT_MODES, MultitaskSettings
from minbert.train.multitask import TASKS as MULTITASK_TASKS
from minbert.train.optim import OPTIMIZERS, SCHEDULERS
from minbert.train.sentiment import MODES, SentimentSettings
from minbert.train.smart import SmartSettings


class ParamsError(ValueError):
    pass


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2's floats: ``3e-05`` (what ``dvc exp run -S lr=3e-5`` writes)
    is a number, where PyYAML's YAML 1.1 rules read a string without a dot."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."))


class Partial(dict):
    """A schema mapping whose keys may be left out (configuration overrides)."""


# A schema is a dict of key -> (type | tuple of allowed values | nested schema |
# [item schema] for a list). "*" matches any key (names the user chooses).
_NUMBER = (int, float)
_MAX_LENGTH = {task: int for task in TASKS}
_PER_MULTITASK_TASK = {task: int for task in MULTITASK_TASKS}
_PER_SENTIMENT_TASK = {"sst": int, "cfimdb": int}
# One optimizer's hyperparameters; lr_gamma is needed by the exponential schedule only.
_OPTIMIZER = Partial({"lr": _NUMBER, "lr_schedule": tuple(SCHEDULERS), "lr_gamma": _NUMBER,
                      "weight_decay": _NUMBER})
_SCALE = {
    "max_length": _MAX_LENGTH,
    "pooling": tuple(POOLINGS),
    "sentiment": {
        "batch_size": _PER_SENTIMENT_TASK,
        "dropout": _NUMBER,
        "max_tokens": int,
        "epochs": {mode: int for mode in MODES},
        "train_examples": _PER_SENTIMENT_TASK,
    },
    "multitask": {
        "epochs": int,
        "dropout": _NUMBER,
        "batch_size": _PER_MULTITASK_TASK,
        "train_examples": _PER_MULTITASK_TASK,
        "history_examples": {"dev": int, "train": int},
        "test_predictions": bool,
        "optimizers": {name: _OPTIMIZER for name in OPTIMIZERS},
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
}
# The keys a configuration may override; their shared defaults sit at top level.
_CONFIG = {
    "optimizer": tuple(OPTIMIZERS),
    "paraphrase_head": tuple(n for n, (_, tasks) in PAIR_HEADS.items() if "quora" in tasks),
    "sts_head": tuple(n for n, (_, tasks) in PAIR_HEADS.items() if "sts" in tasks),
    "sts_output": STS_OUTPUTS,
    "gradient": GRADIENT_MODES,
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
    "data": {
        "source": str,
        "allow_unverified": bool,
        "verify_checksums": bool,
        "quora_holdout_fraction": _NUMBER,
        "split_seed": int,
        "skip_ids": {"*": {"*": str}},
    },
    "scales": {"*": _SCALE},
    "mlm": {
        "pretrain": [MLM_STARTS],
        "finetune": [str],  # names from `configs`, checked in validate()
        "sources": [CORPUS_SOURCES],
        "mask_prob": _NUMBER,
        "heldout_fraction": _NUMBER,
        "weight_decay": _NUMBER,
        "grad_clip": _NUMBER,
        "starts": {
            "continue": {"lr": _NUMBER},
            "scratch": {"lr": _NUMBER, "hidden_size": int, "num_hidden_layers": int,
                        "num_attention_heads": int, "intermediate_size": int},
        },
    },
    "sentiment": {
        "eval_batch_size": int,
        "weight_decay": _NUMBER,
        "optimizer": tuple(OPTIMIZERS),
        "lr_schedule": tuple(SCHEDULERS),
        "lr_gamma": _NUMBER,
        "grad_clip": _NUMBER,
        "runs": {"*": {"task": ("sst", "cfimdb"), "mode": MODES, "lr": _NUMBER}},
    },
}


def _check(value: Any, schema: Any, key: str, source: str) -> None:
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
            _check(v, sub, f"{key}.{k}" if key else str(k), source)
        missing = [] if isinstance(schema, Partial) else [
            k for k in schema if k != "*" and k not in value]
        if missing:
            raise ParamsError(f"{source}: {key or 'top level'} lacks {', '.join(missing)}")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise ParamsError(f"{source}: {key} must be a list, got {value!r}")
        if len(set(map(repr, value))) != len(value):
            raise ParamsError(f"{source}: {key} lists an entry twice: {value!r}")
        for i, item in enumerate(value):
            _check(item, schema[0], f"{key}[{i}]", source)
    elif isinstance(schema, tuple) and all(isinstance(s, str) for s in schema):
        if value not in schema:
            raise ParamsError(f"{source}: {key} = {value!r} is not one of {list(schema)}")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        # bool is an int in Python; a flag where a count belongs is still an error.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ParamsError(f"{source}: {key} must be {names}, got {value!r}")


def validate(params: dict, source: str = "params.yaml") -> dict:
    _check(params, SCHEMA, "", source)
    if params["scale"] not in params["scales"]:
        raise ParamsError(
            f"{source}: scale = {params['scale']!r} is not one of {sorted(params['scales'])}"
        )
    if params["launcher"].split()[:1] not in (["python"], ["torchrun"]):
        raise ParamsError(f"{source}: launcher = {params['launcher']!r} must be 'python' or a "
                          "'torchrun ...' command line (e.g. 'torchrun --standalone --nproc_per_node 4')")
    for key in ("data.quora_holdout_fraction", "mlm.heldout_fraction", "mlm.mask_prob"):
        group, name = key.split(".")
        if not 0 < params[group][name] < 1:
            raise ParamsError(f"{source}: {key} must lie strictly between 0 and 1")
    for key in ("mlm.finetune", "seed_study.configs"):
        group, name = key.split(".")
        unknown = [c for c in params[group][name] if c not in params["configs"]]
        if unknown:
            raise ParamsError(f"{source}: {key} names {unknown}, which are not in configs: "
                              f"{sorted(params['configs'])}")
    for name, scale_params in params["scales"].items():
        for optimizer, spec in scale_params["multitask"]["optimizers"].items():
            key = f"scales.{name}.multitask.optimizers.{optimizer}"
            missing = [k for k in ("lr", "lr_schedule", "weight_decay") if k not in spec]
            if spec.get("lr_schedule") == "exponential" and "lr_gamma" not in spec:
                missing.append("lr_gamma (the exponential schedule's factor per epoch)")
            if missing:
                raise ParamsError(f"{source}: {key} lacks {', '.join(missing)}")
    if not params["mlm"]["sources"]:
        raise ParamsError(f"{source}: mlm.sources is empty; allowed: {list(CORPUS_SOURCES)}")
    return params


def load(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such parameters file (run from the repository root)") from None
    try:
        params = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    return validate(params or {}, str(path))


def scale(params: dict) -> dict:
    """The settings of the chosen scale (``cpu`` or ``paper``)."""
    return params["scales"][params["scale"]]


def sentiment_settings(params: dict, run: str) -> SentimentSettings:
    runs = params["sentiment"]["runs"]
    if run not in runs:
        raise ParamsError(f"sentiment run {run!r} is not one of {sorted(runs)}")
    spec = runs[run]
    common = params["sentiment"]
    sized = scale(params)["sentiment"]
    return SentimentSettings(
        task=spec["task"],
        mode=spec["mode"],
        lr=float(spec["lr"]),
        epochs=sized["epochs"][spec["mode"]],
        batch_size=sized["batch_size"][spec["task"]],
        eval_batch_size=common["eval_batch_size"],
        dropout=float(sized["dropout"]),
        weight_decay=float(common["weight_decay"]),
        optimizer=common["optimizer"],
        lr_schedule=common["lr_schedule"],
        lr_gamma=float(common["lr_gamma"]),
        grad_clip=float(common["grad_clip"]),
        train_examples=sized["train_examples"][spec["task"]],
        seed=params["seed"],
        max_tokens=sized["max_tokens"],
        pooling=scale(params)["pooling"],
    )


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


def multitask_settings(params: dict, config: str) -> MultitaskSettings:
    values = config_values(params, config)
    common, sized = params["multitask"], scale(params)["multitask"]
    smart = values["smart"]
    # The learning rate, its schedule and the weight decay belong to the optimizer.
    optimizer = sized["optimizers"][values["optimizer"]]
    return MultitaskSettings(
        paraphrase_head=values["paraphrase_head"],
        sts_head=values["sts_head"],
        sts_output=values["sts_output"],
        gradient=values["gradient"],
        optimizer=values["optimizer"],
        lr=float(optimizer["lr"]),
        weight_decay=float(optimizer["weight_decay"]),
        lr_schedule=optimizer["lr_schedule"],
        lr_gamma=float(optimizer.get("lr_gamma", 1.0)),
        epochs=sized["epochs"],
        batch_size=dict(sized["batch_size"]),
        train_examples=dict(sized["train_examples"]),
        history_examples=dict(sized["history_examples"]),
        test_predictions=sized["test_predictions"],
        eval_batch_size=common["eval_batch_size"],
        dropout=float(sized["dropout"]),
        grad_clip=float(common["grad_clip"]),
        seed=params["seed"],
        compile=common["compile"],
        pooling=scale(params)["pooling"],
        smart=SmartSettings(**{k: float(v) if k != "steps" else v
                               for k, v in smart.items() if k != "enabled"})
        if smart["enabled"] else None,
    )


def mlm_settings(params: dict, start: str) -> MlmSettings:
    common = params["mlm"]
    if start not in common["starts"]:
        raise ParamsError(f"MLM start {start!r} is not one of {sorted(common['starts'])}")
    spec = dict(common["starts"][start])
    sized = scale(params)["mlm"]
    return MlmSettings(
        start=start,
        lr=float(spec.pop("lr")),
        epochs=sized["epochs"],
        batch_size=sized["batch_size"],
        max_length=sized["max_length"],
        sequences=sized["sequences"],
        heldout_fraction=float(common["heldout_fraction"]),
        mask_prob=float(common["mask_prob"]),
        weight_decay=float(common["weight_decay"]),
        grad_clip=float(common["grad_clip"]),
        sources=tuple(common["sources"]),
        scratch_config=spec,  # the fresh model's size (scratch only)
        seed=params["seed"],
    )
