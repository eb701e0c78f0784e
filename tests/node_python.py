"""A Python holding only some packages, for the imitation GPU node: a virtual environment
of the interpreter beneath this one (no pip, nothing of the test tools) into which the
named packages and what they require are linked from this environment."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(packages: list[str], without: tuple[str, ...] = ()) -> dict[str, object]:
    """The distributions of ``packages`` and of everything they require (no extras), by
    name, less those of ``without`` wherever they are required."""
    found, todo, left_out = {}, list(packages), {canonicalize_name(n) for n in without}
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found or name in left_out:
            continue
        try:
            found[name] = dist = distribution(name)
        except PackageNotFoundError:
            continue  # a requirement of another platform or Python, not installed here
        for line in dist.requires or []:
            required = Requirement(line)
            if required.marker is None or required.marker.evaluate({"extra": ""}):
                todo.append(required.name)
    return found


def node_python(root: Path, packages: list[str], without: tuple[str, ...] = ()) -> Path:
    """``root``/bin/python3: a virtual environment holding only ``packages`` and their
    requirements, less ``without``."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    for dist in closure(packages, without).values():
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops):
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    return root / "bin" / "python3"
