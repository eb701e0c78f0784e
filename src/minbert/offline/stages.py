"""The pipeline's stages as ``dvc.yaml`` declares them, read without DVC.

Expands ``foreach`` (a list: ``name@item``; a mapping: ``name@key``) and ``matrix``
(``name@v1-v2``, values in the matrix's key order), and fills ``${...}`` from
params.yaml and the stage's ``item`` / ``key``, as DVC does for this project's
``dvc.yaml``. Anything else of DVC's templating (``vars``, a ``${...}`` that names
nothing) is an error naming the stage, so a runner never runs a command DVC would
not.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

TEMPLATE = re.compile(r"\$\{\s*([\w.-]+)\s*\}")


class StageError(ValueError):
    """A ``dvc.yaml`` this reader cannot expand, or a stage name it does not hold."""


@dataclass(frozen=True)
class Stage:
    name: str  # as DVC names it: `multitask@best`
    cmd: str
    deps: tuple[str, ...]
    outs: tuple[str, ...]  # outs, metrics and plots: every path the stage writes

    @property
    def group(self) -> str:
        return self.name.split("@")[0]

    @property
    def source_files(self) -> tuple[str, ...]:
        """The Python files among its dependencies: the code it runs."""
        return tuple(d for d in self.deps if d.endswith(".py"))


def _lookup(context: dict, dotted: str, where: str):
    value = context
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise StageError(f"dvc.yaml: {where}: ${{{dotted}}} names nothing in params.yaml or the stage")
        value = value[part]
    return value


def _fill(value, context: dict, where: str):
    """``value`` with every ``${...}`` filled; a string that is one template keeps the
    looked-up value's type (a list for ``foreach``)."""
    if isinstance(value, str):
        whole = TEMPLATE.fullmatch(value.strip())
        if whole:
            return _lookup(context, whole.group(1), where)
        return TEMPLATE.sub(lambda m: str(_lookup(context, m.group(1), where)), value)
    if isinstance(value, list):
        return [_fill(v, context, where) for v in value]
    if isinstance(value, dict):
        return {_fill(k, context, where): _fill(v, context, where) for k, v in value.items()}
    return value


def _paths(entries: list | None) -> list[str]:
    """Paths of an outs/metrics/plots list (each entry a path or a one-key mapping)."""
    found = []
    for entry in entries or []:
        found.extend(entry.keys() if isinstance(entry, dict) else [entry])
    return found


def _stage(name: str, body: dict, context: dict) -> Stage:
    body = _fill(body, context, name)
    if "cmd" not in body:
        raise StageError(f"dvc.yaml: stage {name} has no cmd")
    outs = _paths(body.get("outs")) + _paths(body.get("metrics")) + _paths(body.get("plots"))
    return Stage(name, str(body["cmd"]), tuple(body.get("deps") or ()), tuple(outs))


def read_stages(dvc_yaml: Path, params: dict) -> list[Stage]:
    """Every stage of ``dvc_yaml``, expanded, in the file's order."""
    dvc_yaml = Path(dvc_yaml)
    spec = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}
    if "vars" in spec:
        raise StageError(f"{dvc_yaml}: top-level `vars` is not supported by the offline reader")
    stages = []
    for group, body in (spec.get("stages") or {}).items():
        if "foreach" in body:
            items = _fill(body["foreach"], params, group)
            pairs = items.items() if isinstance(items, dict) else ((None, item) for item in items)
            for key, item in pairs:
                label = key if key is not None else item
                context = {**params, "item": item, **({"key": key} if key is not None else {})}
                stages.append(_stage(f"{group}@{label}", body["do"], context))
        elif "matrix" in body:
            axes = {k: _fill(v, params, group) for k, v in body["matrix"].items()}
            rest = {k: v for k, v in body.items() if k != "matrix"}
            for values in itertools.product(*axes.values()):
                item = dict(zip(axes, values))
                label = "-".join(str(v) for v in values)
                stages.append(_stage(f"{group}@{label}", rest, {**params, "item": item}))
        else:
            stages.append(_stage(group, body, params))
    return stages


def select(stages: list[Stage], names: list[str]) -> list[Stage]:
    """The stages named (a full name, or a group such as `multitask` for all of its
    stages), in ``dvc.yaml``'s order; none named: all. An unknown name is an error."""
    if not names:
        return list(stages)
    known = {s.name for s in stages} | {s.group for s in stages}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise StageError(f"no stage {', '.join(unknown)} in dvc.yaml (stages: {', '.join(sorted(known))})")
    return [s for s in stages if s.name in names or s.group in names]
