"""The plan: the pipeline's stages as DVC resolves them for one study (``resolve_plan``, on
the DVC machine, with the study's overrides): each stage's command, deps, outs and needs,
its ``sources`` (sha256 of files no stage writes) and ``inputs`` (command, params values,
settings files' sha256). A result is current while its ``fingerprint`` (its stage's and
every upstream stage's) is unchanged. The functions below ``resolve_plan`` need no DVC."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

PLAN_FORMAT = "minbert-offline-plan/2"
# Stages that never run on the node, and why.
OFF_NODE = {"report": "the report is built on the DVC machine from the unpacked results"}
# The stage that writes every stage's settings from params.yaml: run here, for the inputs.
SETTINGS_STAGE = "resolve"
# What comes back from the node: metrics, records, histories and predictions. Prepared
# and tokenised tables, features and models stay there (they are large, and rebuilt by
# every call that needs them).
RETURNED = ("metrics/", "predictions/")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _record(stage, needs: list[str], repo: Path, written: list[str], settings: dict[str, str]) -> dict:
    """One DVC stage as the plan keeps it; ``written``: every out of the pipeline;
    ``settings``: the sha256 of each settings file by its path in the repository."""
    from dvc.dependency.param import ParamsDependency

    from minbert.data.download import sha256_file

    files = [d.def_path for d in stage.deps if not isinstance(d, ParamsDependency)]
    sources = {
        f: sha256_file(repo / f) if (repo / f).is_file() else "missing"
        for f in files
        if not any(_within(f, out) for out in written)
    }
    inputs = {f"cmd of {stage.name}": _sha256(stage.cmd.encode())}
    for dep in stage.deps:
        # A dependency on the whole file (resolve's) is covered by the settings files.
        if isinstance(dep, ParamsDependency) and dep.params:
            for key, value in dep.read_params().items():
                inputs[f"params.yaml:{key}"] = _sha256(json.dumps(value, sort_keys=True).encode())
    inputs.update({f: settings[f] for f in files if f in settings})
    return {
        "name": stage.name,
        "cmd": stage.cmd,
        "deps": files,
        "outs": [o.def_path for o in stage.outs],
        "needs": needs,
        "sources": sources,
        "inputs": inputs,
    }


def resolve_plan(repo: Path, overrides: list[str], manifest: dict | None = None) -> dict:
    """The stages of ``repo`` for params.yaml with ``overrides`` (``KEY.PATH=VALUE``, as
    ``dvc exp run -S`` takes them), resolved and ordered by DVC; the settings from the
    data stage's ``manifest`` (default: as ``write_settings`` finds one), kept in the plan."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import get_active_graph, plan_repro

    from minbert.data.download import sha256_file
    from minbert.pipeline.schema import read
    from minbert.tools.reach import scratch_repo, write_settings

    repo = Path(repo)
    # A study off this machine fine-tunes every configuration: `repro_configs` leaves some
    # out only to keep this machine's `dvc repro` within its budget.
    every = f"repro_configs=[{','.join(read(repo / 'params.yaml')['configs'])}]"
    chosen = any(o.startswith("repro_configs=") for o in overrides)
    with scratch_repo(repo, [*overrides, *([] if chosen else [every])]) as scratch:
        params = read(scratch / "params.yaml")
        with Repo(str(scratch)) as dvc:
            stage = next(s for s in dvc.index.stages if s.name == SETTINGS_STAGE)
            manifest = write_settings(repo, scratch, stage, scratch / "settings", manifest)
            graph = get_active_graph(dvc.index.graph)
            ordered = [s for s in plan_repro(graph) if s.name not in OFF_NODE]
            (out,) = [o.def_path for s in ordered if s.name == SETTINGS_STAGE for o in s.outs]
            settings = {
                f"{out}/{p.relative_to(scratch / 'settings').as_posix()}": sha256_file(p)
                for p in (scratch / "settings").rglob("*")
                if p.is_file()
            }
            written = [o.def_path for s in ordered for o in s.outs]
            stages = [
                _record(s, sorted(p.name for p in graph.successors(s)), repo, written, settings)
                for s in ordered
            ]
    return {
        "format": PLAN_FORMAT,
        "overrides": list(overrides),
        "params": params,
        "manifest": manifest,
        "stages": stages,
    }


# ----------------------------------------------------------------------------- no DVC below


def by_name(plan: dict) -> dict[str, dict]:
    return {s["name"]: s for s in plan["stages"]}


def upstream(plan: dict, name: str) -> list[str]:
    """Every stage ``name`` needs, directly or not, in the plan's order."""
    stages, found, todo = by_name(plan), set(), [name]
    while todo:
        for need in stages[todo.pop()]["needs"]:
            if need not in found:
                found.add(need)
                todo.append(need)
    return [s["name"] for s in plan["stages"] if s["name"] in found]


def fingerprint(plan: dict, name: str) -> dict[str, str]:
    """What the result of ``name`` depends on: the sources and inputs of the stage and
    of every stage upstream of it."""
    stages = by_name(plan)
    found = {}
    for stage in (*upstream(plan, name), name):
        found.update(stages[stage]["sources"])
        found.update(stages[stage]["inputs"])
    return found


def returned(stage: dict) -> list[str]:
    """The outs of ``stage`` that come back from the node."""
    return [o for o in stage["outs"] if o.startswith(RETURNED)]


def select(plan: dict, names: list[str]) -> list[str]:
    """The stages to run for ``names`` (a stage, or a group such as ``sentiment`` for
    all of its stages; none: every stage), each after the stages it needs, in the
    order named: a call that is stopped early has run the first ones."""
    stages = by_name(plan)
    groups: dict[str, list[str]] = {}
    for stage in stages:
        groups.setdefault(stage.split("@")[0], []).append(stage)
    unknown = [n for n in names if n not in stages and n not in groups]
    if unknown:
        raise ValueError(
            "; ".join(
                f"{n}: {OFF_NODE[n]}" if n in OFF_NODE else f"no stage {n} in the plan" for n in unknown
            )
            + f" (stages: {', '.join(sorted({*stages, *groups}))})"
        )
    order = []
    for name in names or list(stages):
        for stage in groups.get(name, [name]):
            order += [s for s in (*upstream(plan, stage), stage) if s not in order]
    return order
