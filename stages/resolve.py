"""Stage `resolve`: check params.yaml and write every stage's settings to a file of its own.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import resolve

resolve.main(sys.argv[1:])
