"""Stage `prepare`: validate the course CSV files and write them as Parquet tables."""

from pathlib import Path

from minbert import params
from minbert.data.prepare import prepare

p = params.load()["data"]
prepare(
    p["source"],
    Path("data/prepared"),
    quora_holdout_fraction=p["quora_holdout_fraction"],
    split_seed=p["split_seed"],
    skip_ids=p["skip_ids"],
    allow_unverified=p["allow_unverified"],
    verify_checksums=p["verify_checksums"],
)
