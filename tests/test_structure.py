"""The code's structure: layers with one direction, no import cycle, files of a readable
size, and DVC dependencies that are exactly each stage's import closure."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

SRC = REPO / "src"
PACKAGE = SRC / "minbert"
# The layers from the top: a module never imports a layer above its own, nor the other
# package of its own layer.
LEVELS = [
    ("minbert.cli",),
    ("minbert.offline",),
    ("minbert.tools",),  # the user's commands: nothing the stages run imports them
    ("minbert.pipeline",),
    ("minbert.report", "minbert.train"),
    ("minbert.evaluate",),
    ("minbert.model",),
    ("minbert.data",),
    ("minbert.metrics",),
    ("minbert.tasks",),  # the task records: the lowest layer, read by every other
]
# (package, prefixes it must not import).
LAYERS = [
    (package, (*(p for above in LEVELS[:i] for p in above), *(p for p in level if p != package)))
    for i, level in enumerate(LEVELS)
    if i
    for package in level
]
# The one kind of module name that repeats across folders: one task or stage at each
# layer (src/minbert/__init__.py says which), the folders it may stand in.
SAME_THING_AT_EACH_LAYER = {
    "multitask": {"data", "model", "train", "evaluate", "pipeline"},
    "sentiment": {"train", "evaluate", "pipeline"},
    "mlm": {"model", "train", "pipeline"},
    "zero_shot": {"evaluate", "pipeline"},
    "prepare": {"data", "pipeline"},
    "tokenize": {"data", "pipeline"},
}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(path: Path) -> set[str]:
    """The minbert modules ``path`` imports, anywhere in it (function-level imports too)."""
    here = module_name(path).split(".") if path.is_relative_to(SRC) else ["__main__"]
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("minbert"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if not base.startswith("minbert"):
                continue
            # `from minbert.x import y` imports minbert.x, and minbert.x.y when y is a module.
            found.add(base)
            found.update(
                f"{base}.{alias.name}"
                for alias in node.names
                if module_file(f"{base}.{alias.name}") is not None
            )
    return {name for name in found if module_file(name) is not None}


def with_parents(name: str) -> set[str]:
    """Importing a.b.c runs a/__init__.py and a/b/__init__.py first."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def closure(path: Path) -> set[Path]:
    """Every source file that runs when ``path`` runs."""
    seen: set[str] = set()
    todo = [n for name in imports_of(path) for n in with_parents(name)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [n for imported in imports_of(module_file(name)) for n in with_parents(imported)]
    return {module_file(name) for name in seen}


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_import_cycle():
    graph = {module_name(p): imports_of(p) for p in all_modules()}
    # Depth-first search for a back edge, reporting the cycle it closes.
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                cycle = trail[trail.index(target) :] + [target]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, trail + [target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


@pytest.mark.parametrize("layer, forbidden", LAYERS)
def test_lower_layers_never_import_higher_ones(layer, forbidden):
    for path in all_modules():
        name = module_name(path)
        if name == layer or name.startswith(layer + "."):
            bad = sorted(i for i in imports_of(path) if i.startswith(forbidden))
            assert not bad, f"{path.relative_to(REPO)} ({layer}) imports {bad}"


def test_stages_are_thin_and_call_the_pipeline_only():
    for path in sorted((REPO / "stages").glob("*.py")):
        imported = imports_of(path)
        assert imported and all(i.startswith("minbert.pipeline") for i in imported), (path.name, imported)
        code = [line for line in path.read_text().splitlines() if line.strip()]
        assert len(code) <= 16, f"{path.name}: {len(code)} lines; a stage script only calls the pipeline"


def test_a_module_name_repeats_only_as_one_task_at_several_layers():
    folders: dict[str, set[str]] = {}
    for path in all_modules():
        if path.name != "__init__.py":
            folders.setdefault(path.stem, set()).add(path.parent.relative_to(PACKAGE).as_posix())
    repeated = {name: where for name, where in folders.items() if len(where) > 1}
    stray = {
        name: sorted(where)
        for name, where in repeated.items()
        if not where <= SAME_THING_AT_EACH_LAYER.get(name, set())
    }
    assert not stray, f"module names in several folders that are not one task at each layer: {stray}"


def test_every_pipeline_module_runs_in_a_stage():
    """``minbert.pipeline`` holds the stage adapters and what they share; a command no
    stage runs belongs in ``minbert.tools``."""
    run = set().union(*(closure(path) for path in (REPO / "stages").glob("*.py")))
    idle = [p.name for p in sorted((PACKAGE / "pipeline").glob("*.py")) if p not in run]
    assert not idle, f"pipeline modules no stage runs (user tools belong in minbert.tools): {idle}"


def test_no_source_file_is_too_long():
    long = {
        str(p.relative_to(REPO)): n
        for p in all_modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"


DOCSTRING_SHARE = 0.10  # of src/'s lines; explanations longer than a few lines go to docs/


def _docstring_lines(tree: ast.Module) -> int:
    return sum(
        node.body[0].end_lineno - node.body[0].lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ast.get_docstring(node, clean=False) is not None
    )


def test_docstrings_stay_short():
    files = [path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py")]
    docstrings = sum(_docstring_lines(ast.parse(text)) for text in files)
    lines = sum(len(text.splitlines()) for text in files)
    assert docstrings <= DOCSTRING_SHARE * lines, (
        f"docstrings are {docstrings / lines:.1%} of src/ ({docstrings} of {lines} lines), over "
        f"{DOCSTRING_SHARE:.0%}: move the explanation to docs/"
    )


def test_the_data_stage_needs_no_torch():
    files = {module_name(p) for p in closure(REPO / "stages" / "prepare.py")}
    assert "minbert.device" not in files and not any(
        f.startswith(("minbert.model", "minbert.train")) for f in files
    )


def _stages() -> dict[str, dict]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _entry_point(stage: dict) -> Path:
    cmd = stage["do"]["cmd"] if "do" in stage else stage["cmd"]
    return REPO / re.search(r"(stages/\S+\.py)", cmd).group(1)


@pytest.mark.parametrize("name", sorted(_stages()))
def test_stage_deps_are_exactly_the_import_closure(name):
    """A stage's code deps in dvc.yaml: its script and every source file it runs, no more."""
    stage = _stages()[name]
    body = stage.get("do", stage)
    listed = {d for d in body["deps"] if d.endswith(".py")}
    entry = _entry_point(stage)
    expected = {str(p.relative_to(REPO)) for p in closure(entry) | {entry}}
    assert listed == expected, (
        f"dvc.yaml stage {name}: missing {sorted(expected - listed)}, "
        f"not imported {sorted(listed - expected)}"
    )


def _imports_torch(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch")
        for node in ast.walk(tree)
    )


def test_resolve_needs_no_torch():
    """The stage that turns params.yaml into settings files reads the settings layer only:
    no module it runs imports torch (checked in the source, and by importing it)."""
    files = closure(REPO / "stages" / "resolve.py")
    assert not [str(p.relative_to(REPO)) for p in files if _imports_torch(p)]
    done = subprocess.run(
        [sys.executable, "-c", "import sys, minbert.pipeline.resolve; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.stdout.strip() == "False", done.stderr


def test_training_code_reaches_only_the_stages_that_train_with_it():
    """A change to PCGrad (training code of the multitask stages alone) leaves `resolve`,
    `tokenize`, the sentiment runs and the zero-shot row up to date in `dvc status`."""
    stages = _stages()
    for name in ("resolve", "tokenize", "sentiment", "zero-shot"):
        body = stages[name].get("do", stages[name])
        assert "src/minbert/train/pcgrad.py" not in body["deps"], name
    assert "src/minbert/train/pcgrad.py" in stages["multitask"]["do"]["deps"]


def test_run_files_are_read_only_through_the_runs_module():
    """A run's metrics file and record come back typed (``minbert.runs``): no other module
    reads them as dicts, so no page indexes a run by a string key."""
    readers = sorted(
        str(path.relative_to(REPO))
        for folder in ("src", "stages", "bench")
        for path in (REPO / folder).rglob("*.py")
        if re.search(r"\bread_results?\b", path.read_text(encoding="utf-8"))
    )
    assert readers == ["src/minbert/results.py", "src/minbert/runs/training.py"], readers
    # Nor parses one itself (a metrics file or a record: a line that loads JSON and names
    # metrics or a record), the stages, tools and benches included. Two handle a returned
    # record as a JSON document, every key kept as it is: the node's runner stamps how the
    # stage ran onto it, and the lanes bench strips that stamp to compare two calls' files.
    documents = {"src/minbert/offline/runner.py", "bench/lanes.py"}
    parsed = sorted(
        f"{path.relative_to(REPO)}:{n}"
        for folder in ("src", "stages", "bench")
        for path in (REPO / folder).rglob("*.py")
        if not str(path.relative_to(REPO)).startswith(("src/minbert/runs/", "src/minbert/results.py"))
        and str(path.relative_to(REPO)) not in documents
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"json\.loads?\(", line) and re.search(r"metrics|record", line)
    )
    assert parsed == [], parsed
    # The studies' files and the GPU study's provenance too: the report parses JSON only for
    # the benchmarks' results (bench/results/*.json), in one function.
    parsers = {
        str(path.relative_to(REPO)): path.read_text(encoding="utf-8").count("json.loads")
        for path in (REPO / "src" / "minbert" / "report").glob("*.py")
    }
    assert {name: n for name, n in parsers.items() if n} == {"src/minbert/report/writer.py": 1}
