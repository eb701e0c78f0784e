"""What every training loop shares: the non-finite-loss guard, the best-epoch record and
the epoch progress bar.

The sentiment, multitask and MLM loops differ in what a step is; they agree on
this: a NaN or infinite loss stops training at once, naming where it happened; the
epoch kept is the best one after training began (epoch 0 is the untrained model's
reference point, never kept); and a long loop shows its progress and an ETA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from rich.progress import Progress

from minbert.progress import progress


class NonFiniteLoss(FloatingPointError):
    pass


class NonFiniteGuard:
    """Checks each step's losses without making the host wait for the device.

    ``push`` hands over a step's losses (a tensor) and what identifies the step;
    ``describe(step, local)`` makes the message when they are not finite (``local``:
    this process's own values, where they differ from the pushed global ones). On a
    GPU the losses go to the host asynchronously and are checked one step later, when
    the device has long finished them, so the host keeps queueing work; on the CPU
    they are checked at once. ``last`` holds the newest losses checked.
    """

    def __init__(self, describe: Callable[[Any, torch.Tensor], str]):
        self.describe = describe
        self.pending = None  # (host copy of [global, local], event or None, step)
        self.last: torch.Tensor | None = None

    def push(self, losses: torch.Tensor, step: Any, local: torch.Tensor | None = None) -> None:
        both = torch.stack([losses, losses if local is None else local]).detach()
        event = None
        if both.is_cuda:
            both = both.to("cpu", non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self.check()
        self.pending = (both, event, step)
        if event is None:
            self.check()

    def check(self) -> None:
        """Check the pending step's losses (waiting for them if need be)."""
        if self.pending is None:
            return
        both, event, step = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        if not bool(torch.isfinite(both[0]).all()):
            raise NonFiniteLoss(self.describe(step, both[1]))
        self.last = both[0]


class BestEpoch:
    """The best epoch so far by a score, with a CPU copy of its weights.

    Strictly better only: a tie keeps the earlier (cheaper, less fitted) epoch.
    """

    def __init__(self) -> None:
        self.epoch, self.score, self.weights = 0, None, None

    def offer(self, epoch: int, score: float, weights: Callable[[], dict]) -> bool:
        """Keep ``epoch`` if it beats the best so far; ``weights()`` copies its state."""
        if self.weights is not None and score <= self.score:
            return False
        self.epoch, self.score, self.weights = epoch, score, weights()
        return True

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "score": self.score, "weights": self.weights}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.score, self.weights = state["epoch"], state["score"], state["weights"]


def cpu_copy(module: torch.nn.Module) -> dict:
    """A detached CPU copy of a module's state (the weights an epoch is kept with)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def epoch_progress(
    description: str, epochs: int, steps_per_epoch: int, first_epoch: int = 1, quiet: bool = False
) -> tuple[Progress, Any]:
    """A progress bar over all epochs' steps, started at ``first_epoch`` (after a resume);
    use the bar as a context manager and advance the returned task."""
    bar = progress(quiet=quiet)
    job = bar.add_task(
        description, total=epochs * steps_per_epoch, status="", completed=(first_epoch - 1) * steps_per_epoch
    )
    return bar, job
