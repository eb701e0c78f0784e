"""Peak resident memory of every pipeline stage, measured during a real `dvc repro`.

Runs a command (default: ``dvc repro``), and while it runs polls ``/proc`` for
every descendant process; each stage is a ``python stages/<name>.py ...`` process
whose ``VmHWM`` (the kernel's own peak-RSS high-water mark, so short peaks between
polls are not missed) is recorded against its command line. Writes
``bench/results/stage_memory.json`` with each stage's peak and wall time, and
checks the targets: default `dvc repro` peak resident memory <= 4 GB, and the whole
command <= 45 minutes (on the 2-core machine it is written for, nothing else running).
The machine's own speed moves from hour to hour (its fp32 matmul rate by a quarter and
more, docs/performance.md), so the file also records that rate, measured with the
stages' CPU code paths just before and just after the command.

    python bench/stage_memory.py                  # dvc repro
    python bench/stage_memory.py -- dvc repro -f  # any command after --

Linux only (reads /proc).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import common

from minbert.device import pin_cpu_kernels

LIMIT_GB = 4.0
LIMIT_MINUTES = 45.0


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        kids = []
        for task in tasks:
            kids += [int(k) for k in (task / "children").read_text().split()]
        return kids
    except OSError:
        return []


def _descendants(pid: int) -> dict[int, int]:
    """Every process below ``pid``, with its parent."""
    out, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for kid in _children(parent):
            out[kid] = parent
            todo.append(kid)
    return out


def _stage_name(pid: int) -> str | None:
    """``sentiment sst-full`` for ``python stages/sentiment.py sst-full``; else None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    for i, arg in enumerate(argv):
        if arg.startswith("stages/") and arg.endswith(".py"):
            return " ".join([Path(arg).stem, *[a for a in argv[i + 1 :] if a]])
    return None


def _peak_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _busy_cpu_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (the command)."""
    return sum(
        r.ru_utime + r.ru_stime
        for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--interval", type=float, default=0.2, help="seconds between polls")
    p.add_argument("command", nargs="*", default=["dvc", "repro"])
    args = p.parse_args()
    pin_cpu_kernels()  # before any product: the speed probe takes the stages' code paths
    common.setup(args, repeats=1, warmup=0)
    # A stage's first process -> {"stage", "peak_kb", "first", "last"}; a process it starts
    # (a fork, a worker) is part of the stage: ``root`` maps every process to that one.
    stages: dict[int, dict] = {}
    root: dict[int, int] = {}
    speed_before = common.matmul_peak()
    busy, own = _busy_cpu_s(), _own_cpu_s()
    start = time.perf_counter()
    proc = subprocess.Popen(args.command, cwd=common.REPO)
    while proc.poll() is None:
        now = time.perf_counter() - start
        resident: dict[int, int] = {}  # a stage's processes' peaks, summed
        for pid, parent in _descendants(proc.pid).items():  # parents before their children
            if pid not in root:
                if parent in root:
                    root[pid] = root[parent]
                elif (name := _stage_name(pid)) is not None:
                    root[pid] = pid
                    stages[pid] = {"stage": name, "peak_kb": 0, "first": now}
            peak = _peak_kb(pid)
            if pid in root and peak is not None:
                resident[root[pid]] = resident.get(root[pid], 0) + peak
        for first, kb in resident.items():
            entry = stages[first]
            entry["peak_kb"] = max(entry["peak_kb"], kb)
            entry["last"] = now
        time.sleep(args.interval)
    wall = time.perf_counter() - start
    # Whether the minutes are the command's own: the machine's busy time during the run
    # less the command's (and this poller's), as cores on average.
    other_cpu_s = max(0.0, (_busy_cpu_s() - busy) - (_own_cpu_s() - own))
    if proc.returncode:
        sys.exit(f"{' '.join(args.command)} failed with exit status {proc.returncode}")
    speed_after = common.matmul_peak()

    rows = sorted(stages.values(), key=lambda e: e["first"])
    results = {
        "command": args.command,
        "wall_s": wall,
        "other_work_cores": other_cpu_s / wall,
        "matmul_gflop_s": {
            "size": speed_before["size"],
            "before": speed_before["flop_per_s"] / 1e9,
            "after": speed_after["flop_per_s"] / 1e9,
        },
        "stages": [
            {"stage": e["stage"], "peak_rss_gb": e["peak_kb"] / 2**20, "seconds": e["last"] - e["first"]}
            for e in rows
        ],
    }
    peak = max((e["peak_kb"] for e in rows), default=0) / 2**20
    results["peak_rss_gb"] = peak
    common.table(
        f"{' '.join(args.command)}: {wall / 60:.1f} min",
        ["stage", "peak RSS (GB)", "seconds"],
        [[s["stage"], f"{s['peak_rss_gb']:.2f}", f"{s['seconds']:.0f}"] for s in results["stages"]],
    )
    targets = [
        common.target("peak resident memory of any stage (GB)", peak, "<=", LIMIT_GB),
        common.target("the whole command (minutes)", wall / 60, "<=", LIMIT_MINUTES),
    ]
    common.finish("stage_memory", args, results, targets)


if __name__ == "__main__":
    main()
