"""Stage `tokenize`: WordPiece ids of every prepared table, with the checkpoint's vocabulary.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import tokenize

tokenize.main(sys.argv[1:])
