"""Stage ``prepare``: validate the course CSV files and write them as Parquet tables.

Reads only the ``data`` section of the parameters (``minbert.pipeline.schema``), so the
data stage loads no training code.
"""

from __future__ import annotations

from pathlib import Path

from minbert.data.prepare import prepare
from minbert.errors import reported
from minbert.pipeline.schema import load_data


@reported
def main(params_file: Path, out_dir: Path) -> dict:
    data = load_data(params_file)
    return prepare(
        data["source"],
        out_dir,
        quora_holdout_fraction=data["quora_holdout_fraction"],
        split_seed=data["split_seed"],
        skip_ids=data["skip_ids"],
        allow_unverified=data["allow_unverified"],
        verify_checksums=data["verify_checksums"],
    )
