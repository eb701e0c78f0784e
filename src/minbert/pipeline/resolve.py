"""Stage ``resolve``: every stage's settings, from ``params.yaml`` and the data stage's
manifest, each in a file of its own (``minbert.pipeline.params.resolve_all``), so that a
parameter change reruns exactly the stages it reaches. Keys keep the settings classes'
and ``params.yaml``'s order: equal parameters give equal bytes."""

from __future__ import annotations

import json
from pathlib import Path

from minbert.atomic import atomic_directory
from minbert.errors import reported
from minbert.pipeline.entry import paths
from minbert.pipeline.params import load, resolve_all


def run(params_file: Path, manifest_file: Path, out_dir: Path) -> list[str]:
    """Write every stage's settings file under ``out_dir``; their names."""
    params = load(params_file)
    manifest = json.loads(Path(manifest_file).read_text(encoding="utf-8"))
    resolved = resolve_all(params, manifest)
    with atomic_directory(out_dir) as tmp:
        for name, content in resolved.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    return sorted(resolved)


@reported
def main(argv: list[str]) -> list[str]:
    """The stage script's work; its paths come from dvc.yaml's cmd."""
    given = paths(argv, "params", "manifest", "out")
    return run(given["params"], given["manifest"], given["out"])
