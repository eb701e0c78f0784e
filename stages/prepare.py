"""Stage `prepare`: validate the course CSV files and write them as Parquet tables.

Its paths come from its cmd in dvc.yaml."""

import sys

from minbert.pipeline import prepare

prepare.main(sys.argv[1:])
