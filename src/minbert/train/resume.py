"""The whole training state, saved after every epoch, so that a killed stage rerun by
``dvc repro`` continues from its last epoch and ends with the numbers of an uninterrupted
run (tested): weights, optimizer, schedule, every random generator, the results so far.
A state carries a fingerprint of the run's settings, checkpoint and data, and another
run's is ignored; it is written atomically, loaded with ``weights_only=True`` and removed
once the stage's outputs are written."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Where stages keep their resumable states (git- and DVC-ignored; not an output).
DEFAULT_DIRECTORY = Path(".resume")
# What a saved state holds, as a number, raised whenever that changes: a state an older
# version saved is started over, not resumed (2: a multitask history of EpochScores).
STATE_FORMAT = 2


def fingerprint(**parts: Any) -> str:
    """A stable digest of everything that makes two runs the same run, the state's format
    included."""
    text = json.dumps({"state_format": STATE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def generator_states(numpy_rng: np.random.Generator, *torch_generators: torch.Generator) -> dict:
    """Every random state a run draws from: numpy's, torch's CPU generator, every CUDA
    device's default generator (dropout masks on a GPU draw from it) and the run's own
    ``torch_generators``."""
    return {
        "numpy": numpy_rng.bit_generator.state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": [g.get_state() for g in torch_generators],
    }


def restore_generators(
    state: dict, numpy_rng: np.random.Generator, *torch_generators: torch.Generator
) -> None:
    numpy_rng.bit_generator.state = state["numpy"]
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda", [])
    if cuda:
        if not torch.cuda.is_available() or torch.cuda.device_count() != len(cuda):
            raise ValueError(
                f"the resume state holds {len(cuda)} CUDA generator state(s) and this machine "
                f"has {torch.cuda.device_count() if torch.cuda.is_available() else 0} device(s): "
                "a run resumes on the kind of machine it started on"
            )
        torch.cuda.set_rng_state_all(cuda)
    for g, s in zip(torch_generators, state["generators"], strict=True):
        g.set_state(s)


class ResumePoint:
    """The saved state of one stage run, at ``directory / f"{name}.pt"``."""

    def __init__(self, directory: Path | None, name: str, key: str) -> None:
        self.path = None if directory is None else Path(directory) / f"{name}.pt"
        self.key = key

    def load(self) -> dict | None:
        """The saved state, or None (nothing saved, or saved by a different run)."""
        if self.path is None or not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # damaged (states are written whole) or not ours: ask, not guess
            raise ValueError(
                f"{self.path}: not a readable resume state ({exc.__class__.__name__}); "
                "delete it to start the run over"
            ) from None
        if not isinstance(state, dict) or state.get("key") != self.key:
            return None
        return state["state"]

    def save(self, state: dict) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save({"key": self.key, "state": state}, f)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def clear(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
