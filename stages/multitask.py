"""Stage `multitask@<config>`: multitask fine-tuning of one configuration (Tables 2-4);
with `--checkpoint models/mlm/<start>`, stage `multitask-mlm@<start>-<config>`.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import multitask

multitask.main(sys.argv[1:])
