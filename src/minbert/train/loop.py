"""The epoch driver of every training run, and what their steps share.

``Epochs`` scores the model before any update (epoch 0), then trains and scores every
epoch, keeps the best one by the run's selection score, epoch 0 included (or the last),
saves the whole training state after every epoch (``minbert.train.resume``) and shows
a progress bar. A non-finite loss stops training at once, naming where it happened."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from rich.progress import Progress

from minbert.distributed import World
from minbert.metrics import rises_beyond
from minbert.progress import progress
from minbert.train.resume import ResumePoint


class NonFiniteLoss(FloatingPointError):
    pass


class NonFiniteGuard:
    """Checks each step's losses without making the host wait for the device: on a GPU
    they reach the host asynchronously and are checked one step later; on the CPU at
    once. ``describe(step, local)`` words a failure (``local``: this rank's values);
    ``last`` holds the newest losses checked."""

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
    """The best epoch so far by a score, with a CPU copy of its weights; a tie keeps the
    earlier (cheaper, less fitted) epoch. ``gained``: the last epoch that rose above the
    score of the gain before it by more than the margin (what patience counts from); a
    rise made of small steps counts once its steps add up past the margin."""

    def __init__(self) -> None:
        self.epoch, self.score, self.weights = 0, None, None
        self.gained, self.gained_score = 0, None

    def offer(
        self,
        epoch: int,
        score: float,
        weights: Callable[[], dict],
        margin: Callable[[float], float] = lambda reference: 0.0,
    ) -> bool:
        """Keep ``epoch`` if it beats the best so far; ``weights()`` copies its state."""
        if rises_beyond(score, self.gained_score, margin):
            self.gained, self.gained_score = epoch, score
        if self.weights is not None and score <= self.score:
            return False
        self.epoch, self.score, self.weights = epoch, score, weights()
        return True

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "score": self.score,
            "weights": self.weights,
            "gained": self.gained,
            "gained_score": self.gained_score,
        }

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.score, self.weights = state["epoch"], state["score"], state["weights"]
        # Saved before margins: the best epoch was the last gain.
        self.gained = state.get("gained", self.epoch)
        self.gained_score = state.get("gained_score", self.score)


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


class EpochLoop(Protocol):
    """One kind of training run, as ``Epochs`` drives it; an epoch is kept with a CPU copy
    of ``model``'s weights (``cpu_copy``)."""

    steps_per_epoch: int
    model: torch.nn.Module

    def before(self) -> tuple[dict, float | None]:
        """Epoch 0's history row, the scores before any update, and its selection score
        (None: not a candidate)."""

    def epoch(
        self, epoch: int, step: Callable[[str], None], log: Callable[[str], None]
    ) -> tuple[dict, float | None]:
        """Train one epoch, calling ``step(status)`` after every step; score it; return its
        history row and its selection score (None: the run keeps its last epoch)."""

    def state(self) -> dict:
        """Everything a resumed run needs besides the history: weights, optimizer,
        schedule, random generators (collective under torchrun)."""

    def load_state(self, state: dict) -> None: ...


class Epochs:
    """The epoch driver; made before the run's optimizer, so that a run can tell whether it
    resumes (``resumed``) and skip what only a fresh run does."""

    def __init__(self, resume: ResumePoint | None = None, world: World = World()):
        self.resume, self.world = resume, world
        # Rank 0 reads the saved state and hands it to the others: on several machines
        # only its disk is sure to have it.
        self.saved = world.broadcast(resume.load() if resume and world.is_main else None)

    @property
    def resumed(self) -> bool:
        return self.saved is not None

    def run(
        self,
        loop: EpochLoop,
        epochs: int,
        description: str,
        patience: int = 0,
        margin: Callable[[float], float] = lambda reference: 0.0,
    ) -> tuple[list[dict], int]:
        """Run ``loop`` up to ``epochs``, or (``patience``) until that many epochs in a row
        have not risen above the last gain's score by more than ``margin(that score)``; its
        history (epoch 0 first) and the epoch kept (the best, margin or not), whose weights
        the loop then holds."""
        best, first = BestEpoch(), 1
        if self.saved is not None:
            loop.load_state(self.saved["loop"])
            history = self.saved["history"]
            best.load_state_dict(self.saved["best"])
            first = self.saved["epoch"] + 1
        else:
            row, score = loop.before()
            history = [row]
            if score is not None:  # the start is a candidate: fine-tuning must beat it
                best.offer(0, score, lambda: cpu_copy(loop.model))
        bar, job = epoch_progress(
            description, epochs, loop.steps_per_epoch, first, quiet=not self.world.is_main
        )
        with bar:
            if self.saved is not None:
                bar.console.log(f"resumed from {self.resume.path} after epoch {first - 1}")
            for epoch in range(first, epochs + 1):
                if patience and best.weights is not None and epoch - 1 - best.gained >= patience:
                    break  # ``patience`` epochs in a row no gain beyond the margin
                row, score = loop.epoch(
                    epoch, lambda status: bar.update(job, advance=1, status=status), bar.console.log
                )
                history.append(row)
                if score is not None:
                    best.offer(epoch, score, lambda: cpu_copy(loop.model), margin)
                if self.resume is not None:
                    state = loop.state()  # on every rank: it gathers every rank's generators
                    if self.world.is_main:
                        self.resume.save(
                            {"epoch": epoch, "history": history, "best": best.state_dict(), "loop": state}
                        )
        if best.weights is not None:
            loop.model.load_state_dict(best.weights)
        return history, best.epoch if best.weights is not None else epochs
