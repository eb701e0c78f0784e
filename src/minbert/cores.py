"""The machine's cores shared among processes started side by side (the GPU node's lanes,
``minbert seed-study``'s queue, torchrun on a CPU): each gets cores ÷ processes threads,
not all of them (docs/experiments.md#sweeps). Needs no torch."""

from __future__ import annotations

import os

# What torch's and MKL's thread pools read when a process starts.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_each(processes: int, cores: int | None = None) -> int:
    """Threads for each of ``processes`` sharing ``cores`` (default: this machine's)."""
    return max(1, (cores or usable_cores()) // max(1, processes))


def side_by_side(processes: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for one of ``processes`` started side by side."""
    threads = str(threads_each(processes))
    return {**(os.environ if env is None else env), **dict.fromkeys(THREAD_VARIABLES, threads)}
