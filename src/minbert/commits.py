"""A commit's files and names as git gives them: the one caller of git for the tools that
read experiments and for the offline bundle."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """The output of ``git <args>`` run in ``repo``; a failure is an ``OSError`` with git's
    own message (one line, errors.py)."""
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()}")
    return done.stdout
