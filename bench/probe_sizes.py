"""How many Quora pairs a linear probe on the frozen checkpoint needs to beat "always 0".

Not a timing. The ``features`` stage's vectors (``data/features``: all-MiniLM-L6-v2,
mean pooling, every training row) of the carved Quora training pairs; ``--heldout`` of them
(whole question groups, ``minbert.data.validation_split.carve_validation``) are set aside, and a
logistic regression (scikit-learn, L2, C=1) is fitted on ``n`` of the rest for each ``n``,
for three inputs: ``concat(u, v)`` (the siamese concat head of ``baseline``: a sum of a
function of each question, no product of the two), ``concat(u, v, |u - v|)`` (``siamese-diff``)
and the packed pair (``cross-encoder``). Scored on the held-out pairs: accuracy against the
always-not-duplicate rate, and Matthews' correlation. Writes ``bench/results/probe_sizes.json``.
"""

from __future__ import annotations

import common
import numpy as np

SIZES = (192, 1000, 2000, 4000, 8000)


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--heldout", type=int, default=4000)
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)
    from sklearn.linear_model import LogisticRegression

    from minbert.data.batches import TokenizedTable
    from minbert.data.multitask import TaskData
    from minbert.data.validation_split import carve_validation
    from minbert.metrics import mcc

    features = common.probe_features()
    table = TokenizedTable.read(common.TOKENIZED / "quora-train.parquet")
    rest, heldout = carve_validation(table, args.heldout, args.seed)
    rng = np.random.default_rng(args.seed)

    def inputs(rows: TokenizedTable, kind: str) -> np.ndarray:
        if kind == "cross-encoder":
            return features.vectors(TaskData("quora", rows, False), rows.ids, common.CPU).numpy()
        pairs = features.vectors(TaskData("quora", rows, True), rows.ids, common.CPU).numpy()
        u, v = pairs[:, 0], pairs[:, 1]
        return np.concatenate([u, v] if kind == "siamese-concat" else [u, v, np.abs(u - v)], axis=1)

    always_zero = float(np.mean(heldout.labels == 0))
    results = {"heldout_pairs": len(heldout), "always_zero_accuracy": always_zero, "probes": {}}
    for kind in ("siamese-concat", "siamese-concat-diff", "cross-encoder"):
        test_x = inputs(heldout, kind)
        results["probes"][kind] = {}
        for n in SIZES:
            rows = rest.subset(np.sort(rng.choice(len(rest), size=min(n, len(rest)), replace=False)))
            fitted = LogisticRegression(max_iter=2000).fit(inputs(rows, kind), rows.labels)
            predicted = fitted.predict(test_x)
            results["probes"][kind][str(n)] = {
                "accuracy": float(np.mean(predicted == heldout.labels)),
                "mcc": mcc(heldout.labels, predicted),
            }
    common.table(
        f"Quora probe on the frozen checkpoint: held-out accuracy (MCC); always 0: {always_zero:.3f}",
        ["head input", *(f"{n} pairs" for n in SIZES)],
        [
            [kind, *(f"{r[str(n)]['accuracy']:.3f} ({r[str(n)]['mcc']:.2f})" for n in SIZES)]
            for kind, r in results["probes"].items()
        ],
    )
    common.finish("probe_sizes", args, results, [])


if __name__ == "__main__":
    main()
