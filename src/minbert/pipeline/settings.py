"""``params.yaml`` checked and resolved into each stage's typed settings.

Every key is checked against the schema below before any work starts: an unknown
key, a value of the wrong type, or a name outside its registry is an error naming
the key and what is allowed. A typo in an ablation (``optimiser: adamaxw``) must
fail loudly, not silently run the default. The settings classes live with what
they configure (``minbert.train``); this module imports them, never the reverse.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from minbert.data.corpus import SOURCES as CORPUS_SOURCES
from minbert.data.tasks import TASKS
from minbert.device import DEVICES
from minbert.metrics import MULTITASK_TASKS
from minbert.model.heads import PAIR_HEADS, POOLINGS, STS_OUTPUTS
from minbert.pipeline.schema import DATA_SCHEMA, ParamsError, Partial, check, read
from minbert.results import RECORD_SUFFIX
from minbert.train.head_warmup import HeadWarmup
from minbert.train.mlm import STARTS as MLM_STARTS
from minbert.train.mlm import MlmSettings
from minbert.train.multitask_step import GRADIENT_MODES, MultitaskSettings
from minbert.train.optim import OPTIMIZERS, SCHEDULERS
from minbert.train.sentiment import MODES, SentimentSettings
from minbert.train.smart import DROPOUT_MASKS, PROJECTIONS, SmartSettings

__all__ = [
    "ParamsError",
    "load",
    "mlm_settings",
    "multitask_settings",
    "resolve_all",
    "resolve_mlm",
    "resolve_multitask",
    "resolve_sentiment",
    "scale",
    "sentiment_settings",
    "validate",
]


_NUMBER = (int, float)
_MAX_LENGTH = {task: int for task in TASKS}
_PER_MULTITASK_TASK = {task: int for task in MULTITASK_TASKS}
_PER_SENTIMENT_TASK = {"sst": int, "cfimdb": int}
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
        "epochs": {mode: int for mode in MODES},
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
        "carved_quora_batch": ("fixed", "paper-proportions"),
        "history_examples": {"dev": int, "train": int},
        "head_warmup": {"epochs": int, "lr": _NUMBER, "tasks": [tuple(MULTITASK_TASKS)]},
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
    "projection": PROJECTIONS,
    "token_norm": _NUMBER,
    "dropout_masks": DROPOUT_MASKS,
}
# The numbers of `smart:` (YAML may give 1 for 1.0); the rest are passed as they are.
_SMART_FLOATS = {k for k, v in _SMART.items() if v == _NUMBER}
# The keys a configuration may override; their shared defaults sit at top level.
_CONFIG = {
    "optimizer": tuple(OPTIMIZERS),
    "paraphrase_head": tuple(n for n, (_, tasks) in PAIR_HEADS.items() if "quora" in tasks),
    "sts_head": tuple(n for n, (_, tasks) in PAIR_HEADS.items() if "sts" in tasks),
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
        "sources": [CORPUS_SOURCES],
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
        "runs": {"*": {"task": ("sst", "cfimdb"), "mode": MODES, "lr": _NUMBER}},
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
        raise ParamsError(f"{source}: mlm.sources is empty; allowed: {list(CORPUS_SOURCES)}")
    return params


def load(path: str | Path = "params.yaml") -> dict:
    """The whole parameters file, every key checked."""
    return validate(read(path), str(Path(path)))


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
        validation_examples=sized["validation_examples"][spec["task"]],
        # Full fine-tuning's head may learn faster than the encoder (``head_lr``);
        # with only the head training, the run's own lr is the head's.
        head_lr=None if spec["mode"] == "last-layer" or sized["head_lr"] is None else float(sized["head_lr"]),
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
    # The learning rates, their schedule and the weight decay belong to the optimizer.
    optimizer = sized["optimizers"][values["optimizer"]]
    factor = values["batch_size_factor"]
    return MultitaskSettings(
        paraphrase_head=values["paraphrase_head"],
        sts_head=values["sts_head"],
        sts_output=values["sts_output"],
        gradient=values["gradient"],
        optimizer=values["optimizer"],
        lr=float(optimizer["lr"]),
        head_lr=float(optimizer["head_lr"]),
        weight_decay=float(optimizer["weight_decay"]),
        lr_schedule=optimizer["lr_schedule"],
        lr_gamma=float(optimizer.get("lr_gamma", 1.0)),
        epochs=sized["epochs"],
        batch_size={t: b * factor for t, b in sized["batch_size"].items()},
        train_examples=dict(sized["train_examples"]),
        validation_examples=dict(sized["validation_examples"]),
        carved_quora_batch=sized["carved_quora_batch"],
        history_examples=dict(sized["history_examples"]),
        head_warmup=HeadWarmup(
            epochs=sized["head_warmup"]["epochs"],
            lr=float(sized["head_warmup"]["lr"]),
            tasks=tuple(sized["head_warmup"]["tasks"]),
        ),
        test_predictions=sized["test_predictions"],
        eval_batch_size=common["eval_batch_size"],
        dropout=float(sized["dropout"]),
        grad_clip=float(common["grad_clip"]),
        seed=params["seed"],
        compile=common["compile"],
        pooling=scale(params)["pooling"],
        smart=SmartSettings(
            **{k: float(v) if k in _SMART_FLOATS else v for k, v in smart.items() if k != "enabled"}
        )
        if smart["enabled"]
        else None,
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


# ----------------------------------------------------------------------------- resolved


def _run_context(params: dict) -> dict:
    return {"checkpoint": params["checkpoint"], "device": params["device"], "scale": params["scale"]}


def resolve_sentiment(params: dict, run: str) -> dict:
    return {"run": run, **_run_context(params), "settings": asdict(sentiment_settings(params, run))}


def resolve_multitask(params: dict, config: str) -> dict:
    # The tokenised lengths travel with the fine-tuned model, for predicting new text.
    return {
        "config": config,
        **_run_context(params),
        "max_length": scale(params)["max_length"],
        "settings": asdict(multitask_settings(params, config)),
    }


def resolve_mlm(params: dict, start: str) -> dict:
    return {"start": start, **_run_context(params), "settings": asdict(mlm_settings(params, start))}


def resolve_zero_shot(params: dict) -> dict:
    return {
        **_run_context(params),
        "seed": params["seed"],
        "pooling": scale(params)["pooling"],
        "quora_train_pairs": params["zero_shot"]["quora_train_pairs"],
        "eval_batch_size": params["multitask"]["eval_batch_size"],
    }


def resolve_tokenize(params: dict) -> dict:
    return {"checkpoint": params["checkpoint"], "max_length": scale(params)["max_length"]}


def resolve_all(params: dict) -> dict[str, dict]:
    """Every stage's settings, resolved from ``params``: file name -> content.

    The ``resolve`` stage writes them, one file per stage; a stage then depends on its
    own file rather than on ``params.yaml``, so a change reruns exactly the stages
    whose resolved settings it changes (``dvc exp run -S smart.beta=0.95`` reruns the
    configurations with SMART, and no other).
    """
    out = {"tokenize.json": resolve_tokenize(params), "zero-shot.json": resolve_zero_shot(params)}
    out.update(
        {f"sentiment/{run}.json": resolve_sentiment(params, run) for run in params["sentiment"]["runs"]}
    )
    out.update({f"multitask/{c}.json": resolve_multitask(params, c) for c in params["configs"]})
    out.update({f"mlm/{start}.json": resolve_mlm(params, start) for start in params["mlm"]["starts"]})
    return out
