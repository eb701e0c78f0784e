"""Stage `resolve`: each multitask configuration's settings in a file of its own."""

from pathlib import Path

from minbert.pipeline import resolve

resolve.main(params_file=Path("params.yaml"), out_dir=Path("data/settings"))
