"""Stage ``prepare``: the course CSV files validated and written as Parquet tables; reads
only the ``data`` section, loading no training code."""

from __future__ import annotations

from minbert.data.prepare import prepare
from minbert.errors import reported
from minbert.pipeline.entry import paths
from minbert.pipeline.schema import load_data


@reported
def main(argv: list[str]) -> dict:
    """The stage script's work; its paths come from dvc.yaml's cmd."""
    given = paths(argv, "params", "out")
    data = load_data(given["params"])
    return prepare(
        data["source"],
        given["out"],
        quora_holdout_fraction=data["quora_holdout_fraction"],
        split_seed=data["split_seed"],
        skip_ids=data["skip_ids"],
        allow_unverified=data["allow_unverified"],
        verify_checksums=data["verify_checksums"],
    )
