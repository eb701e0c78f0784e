"""Stage ``resolve``: every stage's settings, resolved from ``params.yaml`` and the data
stage's manifest into a file of its own (``minbert.pipeline.params.resolve_all``).

A multitask configuration's settings combine the shared defaults, its overrides, its
optimizer's hyperparameters and the scale; a sentiment run's, its run and the
scale. Each stage depends on its own file rather than on those keys, so
``dvc exp run -S smart.beta=0.95`` reruns only the configurations that use SMART,
``-S optimizer=adamaxw`` only those whose optimizer changes, and editing one stage's
code reruns that stage alone. Keys keep the order of the settings classes and of
``params.yaml`` (a stage writes them back in that order), so equal parameters give
equal bytes.
"""

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
