"""Stage `prepare`: validate the course CSV files and write them as Parquet tables."""

from pathlib import Path

from minbert.pipeline import prepare

prepare.main(params_file=Path("params.yaml"), out_dir=Path("data/prepared"))
