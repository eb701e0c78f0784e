"""``params.yaml`` read as YAML 1.2 and checked, every key, before any work starts (the
``resolve`` stage; ``minbert check-params``). The schema places each parameter in the
file; what it accepts and means is declared once, on the settings field it sets
(``minbert.settings``: a ``Setting``). A schema maps a key to a ``Setting`` or a nested
schema (``*``: any key; a ``Partial`` mapping's keys may be left out); an unknown key, a
wrong type, a number out of its range or a name outside its registry is an error naming
the key, the value and what is allowed. Needs no torch: the data stage checks its own
section (``load_data``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from minbert import settings as s
from minbert.results import RECORD_SUFFIX
from minbert.settings import (
    HeadWarmup,
    MlmSettings,
    MultitaskSettings,
    Range,
    SentimentSettings,
    Setting,
    SmartSettings,
    declared,
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
class LeftOut(Setting):
    """A parameter that may be left out where it would not be read (``lr_gamma`` without
    the exponential schedule)."""

    @classmethod
    def of(cls, setting: Setting) -> LeftOut:
        return cls(setting.allowed, setting.meaning)


def check(value: Any, schema: Any, key: str, source: str) -> None:
    if isinstance(schema, Setting):
        check(value, schema.allowed, key, source)
    elif isinstance(schema, dict):
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
        missing = (
            []
            if isinstance(schema, Partial)
            else [
                k for k, sub in schema.items() if k != "*" and k not in value and not isinstance(sub, LeftOut)
            ]
        )
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


def _fields(cls: type, *names: str) -> dict[str, Setting]:
    return {name: declared(cls, name) for name in names}


def _each(keys, setting: Setting) -> dict[str, Setting]:
    """One value per key (per task, per mode, ...), each set as ``setting`` says."""
    return {key: setting for key in keys}


M, W = MultitaskSettings, SentimentSettings
# Parameters that only choose settings (no settings field of their own), declared here.
RATE_FAMILY = Setting(
    str,
    "the learning-rate family: configurations that share a head and a way of stepping share "
    "their rates (scales.<scale>.multitask.rates.<family>), searched on one of them",
)
# Which configurations `dvc repro` runs: dvc.yaml's multitask stages iterate over it.
REPRO_CONFIGS = Setting([str], "the configurations `dvc repro` fine-tunes (names from configs)")
FAMILY_RATES = Partial(_fields(M, "lr", "head_lr"))
LR_SEARCH = {
    "seeds": Setting([s.SEED.allowed], "the seeds every grid point is trained with (at least 3)"),
    "lrs": _each(s.OPTIMIZERS, Setting([s.LEARNING_RATE], "the encoder learning rates of its grid")),
    "jobs": s.SEED_STUDY_JOBS,
}
DATA_SCHEMA = dict(s.DATA)
# One optimizer's hyperparameters; lr_gamma is read by the exponential schedule only.
_LR_GAMMA = {"lr_gamma": LeftOut.of(s.LR_GAMMA)}
_OPTIMIZER = {**_fields(M, "lr", "head_lr", "lr_schedule", "weight_decay"), **_LR_GAMMA}
_SCALE = {
    "max_length": _each(TASKS, s.MAX_LENGTH),
    "pooling": s.POOLING,
    "sentiment": {
        **{
            k: _each(SENTIMENT_TASKS, declared(W, k))
            for k in ("batch_size", "train_examples", "validation_examples")
        },
        **_fields(W, "dropout", "max_tokens", "head_lr", "test_predictions"),
        **{k: _each(s.SENTIMENT_MODES, declared(W, k)) for k in ("epochs", "patience")},
    },
    "multitask": {
        **_fields(
            M,
            *("eval_batch_size", "epochs", "dropout", "max_tokens", "carved_quora_batch"),
            *("test_predictions", "cuda_graphs"),
        ),
        **{
            k: _each(MULTITASK_TASKS, declared(M, k))
            for k in ("batch_size", "train_examples", "validation_examples")
        },
        "history_examples": _each(("dev", "train"), declared(M, "history_examples")),
        "head_warmup": Partial(_fields(HeadWarmup, "epochs", "lr", "batch_size", "tasks")),
        "optimizers": _each(s.OPTIMIZERS, _OPTIMIZER),
        # A family's searched rates per optimizer, over the optimizer's own (optimizers).
        "rates": {"*": Partial(_each(s.OPTIMIZERS, FAMILY_RATES))},
    },
    "mlm": _fields(MlmSettings, "max_length", "epochs", "batch_size", "sequences"),
}
_SMART = {"enabled": s.SMART_ENABLED, **_fields(SmartSettings, *(f.name for f in fields(SmartSettings)))}
# The keys a configuration may override; their shared defaults sit at top level.
_CONFIG = {
    **_fields(M, "optimizer", "paraphrase_head", "sts_head", "sts_output", "gradient"),
    "batches_per_step": s.BATCHES_PER_STEP,
    "rate_family": RATE_FAMILY,
    "smart": _SMART,
}
SCHEMA: dict[str, Any] = {
    **_CONFIG,
    "configs": {"*": Partial({"from": s.CONFIG_PARENT, **_CONFIG, "smart": Partial(_SMART)})},
    "multitask": _fields(M, "grad_clip", "compile"),
    "zero_shot": {"quora_train_pairs": s.QUORA_TRAIN_PAIRS},
    "repro_configs": REPRO_CONFIGS,  # names from `configs`, checked in validate()
    "seed_study": {"seeds": s.SEED_STUDY_SEEDS, "configs": s.SEED_STUDY_CONFIGS, "jobs": s.SEED_STUDY_JOBS},
    "lr_search": LR_SEARCH,
    "seed": s.SEED,
    "device": s.DEVICE,
    "launcher": s.LAUNCHER,  # checked in validate()
    "checkpoint": s.CHECKPOINT,
    "scale": s.SCALE,  # checked against the keys of `scales` below
    "data": DATA_SCHEMA,
    "scales": {"*": _SCALE},
    "mlm": {
        "pretrain": s.MLM_PRETRAIN,
        "finetune": s.MLM_FINETUNE,  # names from `configs`, checked in validate()
        **_fields(MlmSettings, "sources", "mask_prob", "heldout_fraction", "weight_decay", "grad_clip"),
        "starts": {"continue": {"lr": s.MLM_LR}, "scratch": {"lr": s.MLM_LR, **s.SCRATCH_MODEL}},
    },
    "sentiment": {
        **_fields(W, "eval_batch_size", "weight_decay", "optimizer", "lr_schedule", "grad_clip"),
        **_LR_GAMMA,
        "runs": {"*": _fields(W, "task", "mode", "lr")},
    },
}


def allowed_text(schema: Any) -> str:
    """What a parameter accepts, in words."""
    if isinstance(schema, LeftOut):
        return allowed_text(schema.allowed) + ", only with an exponential lr_schedule"
    allowed = schema.allowed if isinstance(schema, Setting) else schema
    if isinstance(allowed, tuple):
        return " \\| ".join(f"`{name}`" for name in allowed)
    if isinstance(allowed, list):
        return "a list of " + allowed_text(allowed[0])
    if isinstance(allowed, dict):
        return "a mapping of names to " + allowed_text(allowed["*"])
    return {bool: "true \\| false", str: "text"}.get(allowed, str(allowed))


def described(schema: Any = None, key: str = "") -> list[tuple[str, str, str]]:
    """(key, what it accepts, what it means) of every parameter, in the file's order; one
    row for a value per task (or mode, or optimizer): ``{sst,quora,sts}``; ``<name>``: any
    key."""
    schema = SCHEMA if schema is None else schema
    rows = []
    for k, sub in schema.items():
        where = (f"{key}.{k}" if key else k).replace("*", "<name>")
        if where == "configs":
            rows += [
                ("configs.<name>.from", allowed_text(s.CONFIG_PARENT), s.CONFIG_PARENT.meaning),
                ("configs.<name>.<key>", "as the key at top level", "this configuration's value of "
                 f"a top-level key ({', '.join(_CONFIG)}; smart's one by one)"),
            ]  # fmt: skip
            continue
        same = list(sub.values()) if isinstance(sub, dict) else []
        if len(same) > 1 and all(v is same[0] for v in same):
            where, sub = f"{where}.{{{','.join(sub)}}}", same[0]
        if isinstance(sub, dict):
            rows += described(sub, where)
        else:
            rows.append((where, allowed_text(sub), sub.meaning))
    return rows


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
    for key, names in (
        ("repro_configs", params["repro_configs"]),
        ("mlm.finetune", params["mlm"]["finetune"]),
        ("seed_study.configs", params["seed_study"]["configs"]),
    ):
        unknown = [c for c in names if c not in params["configs"]]
        if unknown:
            raise ParamsError(
                f"{source}: {key} names {unknown}, which are not in configs: {sorted(params['configs'])}"
            )
    schedules = {"sentiment": params["sentiment"]}
    for name, scale_params in params["scales"].items():
        for optimizer, spec in scale_params["multitask"]["optimizers"].items():
            schedules[f"scales.{name}.multitask.optimizers.{optimizer}"] = spec
    for key, spec in schedules.items():
        if spec["lr_schedule"].startswith("exponential") != ("lr_gamma" in spec):
            raise ParamsError(
                f"{source}: {key}: lr_gamma (the exponential schedules' factor per epoch) goes with "
                f"an exponential lr_schedule and only with it; lr_schedule is {spec['lr_schedule']}"
            )
    if len(params["lr_search"]["seeds"]) < 3:
        raise ParamsError(
            f"{source}: lr_search.seeds has {len(params['lr_search']['seeds'])}; a grid point's mean "
            "over seeds needs at least 3 to have an interval worth the name"
        )
    if not params["mlm"]["sources"]:
        raise ParamsError(f"{source}: mlm.sources is empty; allowed: {list(s.MLM_SOURCES)}")
    for name in params["configs"]:
        lineage(params["configs"], name, source)
    return params


def lineage(configs: dict, name: str, source: str = "params.yaml") -> list[str]:
    """The configuration ``name`` and those it changes (``from``), the furthest first."""
    chain = [name]
    while (parent := (configs[chain[-1]] or {}).get("from")) is not None:
        if parent not in configs:
            raise ParamsError(
                f"{source}: configs.{chain[-1]}.from = {parent!r} is not one of {sorted(configs)}"
            )
        if parent in chain:
            raise ParamsError(
                f"{source}: configs.{name}: 'from' goes round in a circle: {' -> '.join(chain)}"
            )
        chain.append(parent)
    return chain[::-1]


def config_values(params: dict, config: str | None) -> dict:
    """A configuration's effective choices: the top-level defaults, then the overrides of
    each configuration it changes (``from``), then its own (``None``: the defaults alone)."""
    configs = params["configs"]
    if config is not None and config not in configs:
        raise ParamsError(f"configuration {config!r} is not one of {sorted(configs)}")
    values = {key: params[key] for key in _CONFIG}
    values["smart"] = dict(params["smart"])
    for name in [] if config is None else lineage(configs, config):
        overrides = configs[name] or {}
        values.update({k: v for k, v in overrides.items() if k not in ("smart", "from")})
        values["smart"].update(overrides.get("smart", {}))
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
