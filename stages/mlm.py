"""Stage `mlm@<start>`: masked-language-model pretraining (continue | scratch).

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import mlm

mlm.main(sys.argv[1:])
