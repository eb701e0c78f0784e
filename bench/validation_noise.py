"""How noisy a validation score is at a given number of rows: the choice of the cpu scale's
validation sizes.

Not a timing. A score computed on n validation rows varies with which n rows were drawn;
this measures that sampling s.d. by simulation at the levels the cpu study's runs reach
on validation (read from the committed runs' histories at their kept epoch, means over
the configurations): labels and predictions drawn from a bivariate normal whose
correlation is tuned to the level, cut into each task's classes at its training label
prior (SST's 5 classes, Quora's 2) or left continuous (STS's Pearson). The selection
score's s.d. follows as the mean of the three tasks' (independent rows). Writes
``bench/results/validation_noise.json``; params.yaml quotes it. Seconds.
"""

from __future__ import annotations

import common
import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm
from sklearn.metrics import matthews_corrcoef

# The tasks' label priors in their training splits (the course files): SST's five
# classes, Quora's duplicate rate; STS is scored by Pearson on a continuous label.
PRIORS = {"sst": [0.128, 0.26, 0.19, 0.272, 0.15], "quora": [0.63, 0.37]}


def _draw(rho: float, n: int, rng: np.random.Generator, prior: list[float] | None):
    z = rng.multivariate_normal([0.0, 0.0], [[1.0, rho], [rho, 1.0]], n)
    if prior is None:
        return z[:, 0], z[:, 1]
    cuts = norm.ppf(np.cumsum(prior)[:-1])  # the class boundaries on the latent normal
    return np.searchsorted(cuts, z[:, 0]), np.searchsorted(cuts, z[:, 1])


def _score(truth, predicted, prior) -> float:
    return matthews_corrcoef(truth, predicted) if prior is not None else np.corrcoef(truth, predicted)[0, 1]


def _rho_for(level: float, prior, rng) -> float:
    """The latent correlation whose score, on a large sample, is ``level``."""
    return brentq(lambda r: _score(*_draw(r, 100_000, rng, prior), prior) - level, 0.0, 0.99, xtol=1e-3)


def _levels() -> dict[str, float]:
    """The committed cpu runs' validation scores at their kept epoch, averaged."""
    import pandas as pd

    from minbert.results import history_column
    from minbert.runs.training import MultitaskRunFile, read_runs
    from minbert.tasks import MULTITASK_TASKS, TASKS

    directory = common.REPO / "metrics" / "multitask"
    runs = read_runs(MultitaskRunFile, directory)
    kept = [pd.read_csv(directory / f"{r.config}-history.csv").iloc[r.epoch] for r in runs]
    return {
        task: round(
            float(np.mean([row[history_column("val", TASKS[task].selection_key)] for row in kept])), 3
        )
        for task in MULTITASK_TASKS
    }


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[200, 500, 1000, 2000])
    p.add_argument("--draws", type=int, default=2000)
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)
    rng = np.random.default_rng(args.seed)
    levels = _levels()
    priors = {"sst": PRIORS["sst"], "quora": PRIORS["quora"], "sts": None}
    rhos = {t: _rho_for(levels[t], priors[t], rng) for t in levels}
    draws = 200 if args.quick else args.draws
    results = {"levels": levels, "by_size": {}}
    rows = []
    for n in args.sizes:
        sds = {
            t: float(np.std([_score(*_draw(rhos[t], n, rng, priors[t]), priors[t]) for _ in range(draws)]))
            for t in levels
        }
        selection = float(np.sqrt(sum(s**2 for s in sds.values())) / len(sds))
        results["by_size"][str(n)] = {
            **{t: round(s, 4) for t, s in sds.items()},
            "selection": round(selection, 4),
        }
        rows.append([n, *(f"{sds[t]:.3f}" for t in levels), f"{selection:.3f}"])
    common.table("sampling s.d. of a validation score", ["rows", *levels, "selection"], rows)
    common.finish("validation_noise", args, results, [])


if __name__ == "__main__":
    main()
