"""`python -m minbert`: the command line, where the package is on PYTHONPATH but not installed."""

import sys

if sys.argv[1:2] == ["offline-run"]:  # a GPU node: its packages checked before anything loads
    from minbert.offline.node import NodeLacks, require_node_packages

    try:
        require_node_packages()
    except NodeLacks as lacks:
        sys.exit(f"error: offline-run: {lacks}")

from minbert.cli import app  # noqa: E402

app(prog_name="minbert")
