"""The parameters file: read as YAML 1.2, checked against a schema.

A schema is a dict of key -> (type | tuple of allowed values | nested schema |
[item schema] for a list); "*" matches any key (names the user chooses) and a
``Partial`` mapping's keys may be left out. Every error names the key and what is
allowed. This module needs no torch: the data stage checks its own section with it
(``DATA_SCHEMA``) without loading the training code; ``minbert.pipeline.settings``
holds the whole file's schema.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


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
