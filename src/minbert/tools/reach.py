"""What a ``-S`` reaches: the stages ``dvc exp run -S KEY=VALUE`` would rerun, before it runs,
answered by DVC on a scratch copy of ``dvc.yaml``, ``dvc.lock`` and params.yaml with the
overrides applied and the settings files written by ``resolve``'s code: the stages whose
params or settings files differ from the lock, and those downstream. Nothing is hashed."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

# The stage that writes every stage's settings from params.yaml.
SETTINGS_STAGE = "resolve"


@contextlib.contextmanager
def scratch_repo(repo: Path, overrides: list[str], files=("dvc.yaml", "params.yaml")) -> Iterator[Path]:
    """A scratch DVC repository (no git) holding ``files`` of ``repo``, params.yaml with
    ``overrides`` (``KEY.PATH=VALUE``, as ``dvc exp run -S`` takes them) applied and
    checked; removed on exit."""
    from dvc.utils.hydra import apply_overrides

    from minbert.pipeline.schema import ParamsError, read, validate

    with tempfile.TemporaryDirectory(prefix="minbert-scratch.") as tmp:
        scratch = Path(tmp)
        (scratch / ".dvc").mkdir()
        (scratch / ".dvc" / "config").write_text("[core]\n    no_scm = true\n", encoding="utf-8")
        for name in files:
            if (Path(repo) / name).is_file():
                shutil.copyfile(Path(repo) / name, scratch / name)
        # An error names the user's file and overrides, not the scratch copy.
        source = f"params.yaml{' with ' + ', '.join(overrides) if overrides else ''}"
        if overrides:
            try:
                apply_overrides(scratch / "params.yaml", list(overrides))
            except ValueError as exc:  # DVC's own words are in its cause: "use +key=value"
                raise ParamsError(f"{source}: {' '.join(str(exc.__cause__ or exc).split())}") from None
        validate(read(scratch / "params.yaml"), source)
        yield scratch


def write_settings(repo: Path, scratch: Path, stage, out: Path, manifest: dict | None = None) -> dict:
    """The settings files of ``scratch``'s params.yaml, written under ``out`` by
    ``resolve``'s own code (``stage``: DVC's ``resolve`` stage) from the data stage's
    manifest: ``manifest`` if given, ``repo``'s own where it has one and the ``data``
    section is unchanged, else the data stage's own code run on the scratch's
    params.yaml. Returns the manifest used."""
    from minbert.pipeline import prepare, resolve
    from minbert.pipeline.schema import read

    name = Path(re.search(r"--manifest (\S+)", stage.cmd).group(1))
    params = read(scratch / "params.yaml")
    ours = Path(repo) / name
    if manifest is not None:
        ours = scratch / name.name
        ours.write_text(json.dumps(manifest), encoding="utf-8")
    elif not ours.is_file() or read(Path(repo) / "params.yaml").get("data") != params["data"]:
        prepared = scratch / "prepared"
        prepare.main(["--params", str(scratch / "params.yaml"), "--out", str(prepared)])
        ours = prepared / name.name
    resolve.run(scratch / "params.yaml", ours, out)
    return json.loads(ours.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Reached:
    stage: str
    why: str  # what changed for it, or that it is downstream of a stage that reruns


def _name(stage) -> str:
    return stage.addressing.split(":")[-1]  # "dvc.yaml:multitask@best" -> "multitask@best"


def _changed(statuses: list[dict]) -> str:
    """``params.yaml: optimizer`` or ``data/settings/multitask/best.json``: what a
    stage's dependencies' DVC statuses name."""
    said = []
    for status in statuses:
        for path, what in status.items():
            said.append(f"{path}: {', '.join(what)}" if isinstance(what, dict) else path)
    return "; ".join(said)


def reach(repo: Path, overrides: list[str]) -> list[Reached]:
    """The stages ``dvc exp run`` with ``overrides`` would rerun, in DVC's run order,
    judged against ``repo``'s dvc.lock (stages stale for another reason, e.g. changed
    code, are ``dvc status``'s)."""
    import networkx as nx
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo
    from dvc.repo.reproduce import plan_repro

    files = ("dvc.yaml", "dvc.lock", "params.yaml")
    with scratch_repo(repo, overrides, files) as scratch, Repo(str(scratch)) as dvc:
        stages = {_name(s): s for s in dvc.index.stages}
        written = [o.def_path for o in stages[SETTINGS_STAGE].outs]
        write_settings(repo, scratch, stages[SETTINGS_STAGE], scratch / written[0])
        locked = _locked(scratch)
        direct = {}
        for name, stage in stages.items():
            # Only params and settings files can differ here: the rest is the lock's.
            statuses = [
                d.status()
                for d in stage.deps
                if isinstance(d, ParamsDependency)
                or any(d.def_path == w or d.def_path.startswith(w + "/") for w in written)
            ]
            if name not in locked:
                direct[name] = "new: not in dvc.lock"
            elif any(statuses):
                direct[name] = _changed([s for s in statuses if s])
        # Downstream: every stage that depends, through others, on one that reruns
        # (``resolve`` excepted: only the settings files it changes reach further).
        graph = dvc.index.graph
        downstream = {_name(a) for n in direct if n != SETTINGS_STAGE for a in nx.ancestors(graph, stages[n])}
        order = [_name(s) for s in plan_repro(graph)]
    return [
        Reached(n, direct.get(n) or "downstream: its inputs are outputs of the stages above")
        for n in order
        if n in direct or n in downstream
    ]


def _locked(scratch: Path) -> set[str]:
    """The stages dvc.lock records."""
    lock = scratch / "dvc.lock"
    return set((yaml.safe_load(lock.read_text()) or {}).get("stages") or {}) if lock.is_file() else set()


def describe(repo: Path, overrides: list[str]) -> str:
    """``minbert reach``'s text: a line per stage that would rerun, with why."""
    found = reach(repo, overrides)
    given = " ".join(f"-S {o}" for o in overrides) or "no -S"
    if not found:
        return f"{given}: no stage reruns (against dvc.lock)"
    width = max(len(r.stage) for r in found)
    return "\n".join(
        [f"{given}: {len(found)} stages rerun (against dvc.lock)"]
        + [f"  {r.stage:<{width}}  {r.why}" for r in found]
    )
