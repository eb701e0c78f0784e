"""A stage script's entry: the paths its ``cmd`` in ``dvc.yaml`` gives (the scripts name
none), its resolved settings file, and a ``main`` that ends bad input in one line.
Needs no torch."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minbert.errors import reported


def paths(
    argv: list[str], *required: str, optional: tuple[str, ...] = (), several: tuple[str, ...] = ()
) -> dict[str, Path | list[Path] | None]:
    """``--name PATH`` for each of ``required`` (and of ``optional``, None when absent);
    ``--name PATH [PATH ...]`` for each of ``several`` (an empty list when absent)."""
    parser = argparse.ArgumentParser(
        prog=Path(sys.argv[0]).name, description="A pipeline stage: its paths come from dvc.yaml's cmd."
    )
    for name in required:
        parser.add_argument(f"--{name}", type=Path, required=True)
    for name in optional:
        parser.add_argument(f"--{name}", type=Path)
    for name in several:
        parser.add_argument(f"--{name}", type=Path, nargs="+", default=[])
    return vars(parser.parse_args(argv))


def read_settings(path: Path) -> dict:
    """A stage's resolved settings file (what it reads instead of ``params.yaml``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no resolved settings (run `dvc repro resolve`)")
    return json.loads(path.read_text(encoding="utf-8"))


def stage_main(run: Callable[..., Any], *required: str, optional: tuple[str, ...] = ()):
    """The ``main(argv)`` of a stage whose ``run(resolved, **paths)`` takes its settings
    file's content (``--settings``) and the paths ``required`` and ``optional``, by name."""

    @reported
    def main(argv: list[str]) -> Any:
        given = paths(argv, "settings", *required, optional=optional)
        return run(read_settings(given.pop("settings")), **given)

    return main
