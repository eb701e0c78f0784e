"""What a GPU node must hold to run a study call: the packages the command line, the runner
and the stages it runs import (docs/gpu-node.md lists them). ``offline-run`` imports each
before its first stage, so that a node without one stops there, naming it."""

from __future__ import annotations

import importlib

# Import name -> the package that provides it. DVC is not among them: the node runs the
# plan DVC resolved on the DVC machine. huggingface_hub (hub checkpoints) and matplotlib
# (the report) are not either: the bundle carries the checkpoint, the report is built
# on the DVC machine.
NODE_PACKAGES = {
    "torch": "torch",
    "numpy": "numpy",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "scipy": "scipy",
    "sklearn": "scikit-learn",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "yaml": "pyyaml",
    "typer": "typer",
    "rich": "rich",
}


class NodeLacks(EnvironmentError):  # an OSError: the command line reports it in one line
    pass


def missing_packages() -> list[str]:
    """The packages of ``NODE_PACKAGES`` this Python cannot import, each with why."""
    missing = []
    for module, package in NODE_PACKAGES.items():
        try:
            importlib.import_module(module)
        except Exception as error:  # a package whose own dependency is missing fails here too
            missing.append(f"{package} ({type(error).__name__}: {error})")
    return missing


def require_node_packages() -> None:
    """Raise :class:`NodeLacks`, in one line naming each package missing, unless this
    Python imports every one of ``NODE_PACKAGES``."""
    missing = missing_packages()
    if missing:
        raise NodeLacks(
            f"this node cannot import {'; '.join(missing)}; a call needs "
            f"{', '.join(NODE_PACKAGES.values())} (docs/gpu-node.md)"
        )
