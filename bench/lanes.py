"""The GPU node's lanes, measured on this machine: one call of a bundle's plan (`minbert
bundle`) run from fresh copies of what a call sends, in one lane and in --lanes K, the same
stages, one after the other; each call's wall seconds, and which returned files differ but
for how their stage ran (the runner's `offline_run.ran`, the thread count in a record's
`device`): one lane takes the cores, K lanes the cores ÷ K threads each, and a model
trained with other threads can differ in its float bits (tests/test_offline.py checks
lanes at equal threads). Target: K lanes end sooner than one. On a GPU node the calls'
indexes are the sharing factor's evidence (`minbert gpu-unpack` both, then `gpu-plan`).

    python bench/lanes.py --repo PROJECT --lanes 2 [--stage NAME ...]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, console, finish, parser, setup, table, target

from minbert.offline import parts
from minbert.offline.bundle import sent_files


def node_copy(repo: Path, bundle: Path, node: Path) -> Path:
    """What a call sends (the files git sends, and the bundle), copied to ``node``."""
    for path in sent_files(repo):
        (node / path.relative_to(repo)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, node / path.relative_to(repo))
    shutil.copytree(repo / bundle, node / bundle)
    return node


def as_returned(name: str, data: bytes) -> bytes:
    """A returned file less how its stage ran: `offline_run.ran` and the thread count."""
    if not name.endswith("-run.json"):
        return data
    record = json.loads(data)
    record.get("offline_run", {}).pop("ran", None)
    record["device"] = re.sub(r"\(\d+ threads\)", "(N threads)", record.get("device", ""))
    return json.dumps(record, sort_keys=True).encode()


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--repo", default=str(REPO), help="the project whose bundle runs")
    p.add_argument("--bundle", default="offline-bundle", help="from the project's root")
    p.add_argument("--lanes", type=int, default=2, help="the lanes measured against one")
    p.add_argument("--stage", action="append", default=[], help="a stage of the plan (repeat); none: all")
    args = p.parse_args()
    setup(args, repeats=1, warmup=0)
    repo = Path(args.repo).resolve()
    seconds, returned = {}, {}
    with tempfile.TemporaryDirectory(prefix="minbert-lanes.") as scratch:
        for lanes in (1, args.lanes):
            node = node_copy(repo, Path(args.bundle), Path(scratch) / f"node{lanes}")
            out = Path(scratch) / f"out{lanes}"
            command = [sys.executable, "-m", "minbert", "offline-run", str(args.bundle), "--out", str(out)]
            command += ["--lanes", str(lanes), *(a for s in args.stage for a in ("--stage", s))]
            env = dict(os.environ, PYTHONPATH=str(node / "src"))
            began = time.monotonic()
            done = subprocess.run(command, cwd=node, env=env, capture_output=True, text=True)
            seconds[lanes] = time.monotonic() - began
            if done.returncode != 0:
                raise SystemExit(f"the call in {lanes} lane(s) failed:\n{done.stdout}\n{done.stderr}")
            returned[lanes] = parts.read(out / parts.INDEX_FILE)
    (one, one_files), (many, many_files) = returned[1], returned[args.lanes]
    names = sorted(n for n in one_files if not n.startswith("logs/"))
    differ = [n for n in names if as_returned(n, one_files[n]) != as_returned(n, many_files.get(n, b""))]
    # A differing record: which of its keys, and their values in one lane and in K.
    details = {
        n: {
            k: [a.get(k), b.get(k)]
            for a, b in [tuple(json.loads(as_returned(n, f[n])) for f in (one_files, many_files))]
            for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)
        }
        for n in differ
        if n.endswith("-run.json")
    }
    stages = {s["stage"]: s for s in many["stages"]}
    table(
        f"one call, {len(one['stages'])} stages",
        ["lanes", "threads a stage", "wall seconds"],
        [[k, idx["threads"], f"{seconds[k]:.1f}"] for k, (idx, _) in returned.items()],
    )
    console.print(f"returned files: {len(names)}, differing but for how their stage ran: {len(differ)}")
    results = {
        "stages": len(one["stages"]),
        "seconds": {str(k): round(v, 1) for k, v in seconds.items()},
        "threads": {str(k): idx["threads"] for k, (idx, _) in returned.items()},
        "ratio": seconds[args.lanes] / seconds[1],
        "returned_files": len(names),
        "differing": differ,
        "differing_keys": details,
        "stage_seconds": {
            str(k): {s["stage"]: s["seconds"] for s in idx["stages"]} for k, (idx, _) in returned.items()
        },
        "shared_with": {n: s["shared_with"] for n, s in stages.items()},
    }
    targets = [
        target(f"{args.lanes} lanes' wall time over one lane's", results["ratio"], "<=", 1.0),
    ]
    finish("lanes", args, results, targets)


if __name__ == "__main__":
    main()
