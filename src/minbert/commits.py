"""The one caller of git: for the tools that read experiments, and the offline bundle."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """``git <args>``'s output in ``repo``; a failure: an ``OSError`` with git's message."""
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()}")
    return done.stdout
