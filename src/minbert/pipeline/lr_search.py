"""``minbert lr-search``: the learning rates of a scale, chosen on the validation split.

Each point of a grid (encoder ``lr`` x heads' ``head_lr``) trains one configuration at
the chosen scale exactly as its stage would, except that nothing of dev is scored
(``train_multitask(score_dev=False)``): the point's score is the validation average
of its best epoch, the same number the stage chooses its epoch by. The best point
per optimizer is what ``params.yaml`` then holds for that optimizer at that scale;
the results go to ``metrics/lr-search.json``, which the report shows.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

from minbert.atomic import atomic_write_text
from minbert.device import pin_cpu_kernels
from minbert.metrics import fixed
from minbert.model.bert import BertModel
from minbert.model.checkpoint import resolve_checkpoint
from minbert.pipeline.multitask import load_tables, quora_batch_size
from minbert.pipeline.params import load, multitask_settings
from minbert.progress import console
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS
from minbert.train.multitask import train_multitask


def search_point(settings, checkpoint_dir: Path, tables, device) -> dict:
    """Train ``settings`` once without scoring dev; its best epoch's validation scores."""
    import torch

    result = train_multitask(
        settings, BertModel.from_pretrained(checkpoint_dir), tables, torch.device(device), score_dev=False
    )
    best = result.history[result.best_epoch]
    return {
        "best_epoch": result.best_epoch,
        **{f"validation_{TASKS[t].metric_key}": best[f"val_{TASKS[t].metric_key}"] for t in MULTITASK_TASKS},
        f"validation_{AVERAGE}": best[f"val_{AVERAGE}"],
        "validation_average_per_epoch": [row[f"val_{AVERAGE}"] for row in result.history],
        "optimizer_steps": result.optimizer_steps,
    }


def lr_search(
    config: str,
    lrs: list[float],
    head_lrs: list[float],
    out: Path,
    params_file: Path = Path("params.yaml"),
    tokenized_dir: Path = Path("data/tokenized"),
    manifest_file: Path = Path("data/prepared/manifest.json"),
    device: str = "cpu",
) -> dict:
    """Train ``config`` at every (lr, head_lr) of the grid and add the points to ``out``
    (points of other optimizers or scales already there are kept; a point measured
    again replaces the old one). Returns the whole file's content."""
    pin_cpu_kernels()
    params = load(params_file)
    base = multitask_settings(params, config)
    manifest = json.loads(Path(manifest_file).read_text(encoding="utf-8"))
    base = replace(
        base,
        test_predictions=False,
        batch_size={**base.batch_size, "quora": quora_batch_size(base, manifest)},
    )
    tables = {key: table for key, table in load_tables(Path(tokenized_dir)).items() if key[1] == "train"}
    checkpoint_dir = resolve_checkpoint(params["checkpoint"])
    out = Path(out)
    study = (
        json.loads(out.read_text(encoding="utf-8"))
        if out.is_file()
        else {"command": "minbert lr-search", "runs": [], "chosen": {}}
    )
    for lr, head_lr in itertools.product(lrs, head_lrs):
        console.log(f"lr-search {config}: {base.optimizer} lr {lr:g}, head_lr {head_lr:g}")
        point = search_point(
            replace(base, lr=float(lr), head_lr=float(head_lr)), checkpoint_dir, tables, device
        )
        key = {
            "scale": params["scale"],
            "config": config,
            "optimizer": base.optimizer,
            "lr": float(lr),
            "head_lr": float(head_lr),
        }
        study["runs"] = [r for r in study["runs"] if {k: r[k] for k in key} != key]
        study["runs"].append({**key, "seed": base.seed, **point})
        console.log(
            f"  validation average {point[f'validation_{AVERAGE}']:.4f} (epoch {point['best_epoch']})"
        )
    study["chosen"] = _chosen(study["runs"])
    atomic_write_text(out, json.dumps(study, indent=2) + "\n")
    return study


def _chosen(runs: list[dict]) -> dict:
    """Per scale and optimizer, the point with the best validation average."""
    chosen: dict = {}
    for run in runs:
        name = f"{run['scale']}/{run['optimizer']}"
        if name not in chosen or run[f"validation_{AVERAGE}"] > chosen[name][f"validation_{AVERAGE}"]:
            chosen[name] = {
                k: run[k] for k in ("scale", "optimizer", "config", "lr", "head_lr", f"validation_{AVERAGE}")
            }
            chosen[name][f"validation_{AVERAGE}"] = fixed(chosen[name][f"validation_{AVERAGE}"])
    return dict(sorted(chosen.items()))
