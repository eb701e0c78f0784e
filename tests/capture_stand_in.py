"""A CPU stand-in for ``minbert.train.graphed_step.CudaGraphs``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class GeneratorReplays:
    """Capture records nothing and each replay reruns the step, as a CUDA graph's replays
    rerun its kernels; of the generators in ``known`` (those the step draws from), each
    one not registered at capture replays as a graph replays it: from its state at
    capture, every time, and left where it stood. Registered ones draw on."""

    def __init__(self, known: Sequence[torch.Generator]) -> None:
        self.known = list(known)
        self.captures = 0

    def __call__(self, fn: Callable[[], None], generators: Sequence[torch.Generator]) -> Callable[[], None]:
        self.captures += 1
        frozen = [(g, g.get_state()) for g in self.known if not any(g is r for r in generators)]

        def replay() -> None:
            standing = [g.get_state() for g, _ in frozen]
            for g, at_capture in frozen:
                g.set_state(at_capture)
            try:
                fn()
            finally:
                for (g, _), state in zip(frozen, standing):
                    g.set_state(state)

        return replay
