"""``minbert lr-search``: each configuration trained at every point of an (``lr``,
``head_lr``) grid as its stage would, without scoring dev; a point's score is its best
epoch's validation selection score. Results go to ``metrics/lr-search.json``; the choices
to ``params.yaml`` (``scales.<scale>.multitask``)."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, replace
from pathlib import Path

from minbert.atomic import atomic_write_text
from minbert.device import pin_cpu_kernels
from minbert.metrics import fixed
from minbert.model.bert import BertModel
from minbert.model.checkpoint import resolve_checkpoint
from minbert.pipeline.multitask import load_tables
from minbert.pipeline.params import load, multitask_settings
from minbert.pipeline.schema import config_values
from minbert.progress import console
from minbert.report.studies import SEARCH_VARIES
from minbert.tasks import AVERAGE, MULTITASK_TASKS, SELECTION, TASKS
from minbert.train.head_warmup import ProbeFeatures
from minbert.train.multitask import train_multitask

SCORE = f"validation_{SELECTION}"


def search_point(settings, checkpoint_dir: Path, tables, device, features=None) -> dict:
    """Train ``settings`` once without scoring dev; its best epoch's validation scores."""
    import torch

    result = train_multitask(
        settings,
        BertModel.from_pretrained(checkpoint_dir),
        tables,
        torch.device(device),
        score_dev=False,
        features=features,
    )
    best = result.history[result.best_epoch].validation
    keys = [k for t in MULTITASK_TASKS for k in dict.fromkeys((TASKS[t].selection_key, TASKS[t].metric_key))]
    return {
        "best_epoch": result.best_epoch,
        **{f"validation_{k}": best[k] for k in (*keys, AVERAGE)},
        SCORE: best[SELECTION],
        f"{SCORE}_per_epoch": [epoch.validation[SELECTION] for epoch in result.history],
        "optimizer_steps": result.optimizer_steps,
        # The settings it ran at (less what the search varies), its rows counted as a run's
        # record counts them: the report checks the runs it chose for against them. Through
        # JSON, as a record holds them (a tuple reads back as a list).
        "ran_at": json.loads(
            json.dumps(
                {
                    **{k: v for k, v in asdict(settings).items() if k not in SEARCH_VARIES},
                    "train_examples": result.train_examples,
                    "validation_examples": result.validation_examples,
                }
            )
        ),
    }


def lr_search(
    configs: list[str],
    lrs: list[float],
    head_lrs: list[float],
    out: Path,
    params_file: Path = Path("params.yaml"),
    tokenized_dir: Path = Path("data/tokenized"),
    manifest_file: Path = Path("data/prepared/manifest.json"),
    features_dir: Path | None = Path("data/features"),
    device: str = "cpu",
) -> dict:
    """Train every configuration of ``configs`` at every (lr, head_lr) of the grid and add
    the points to ``out`` (points of other configurations or scales already there are
    kept; a point measured again replaces the old one). Returns the whole file's content."""
    pin_cpu_kernels()
    params = load(params_file)
    for config in configs:  # the names checked before anything is read
        config_values(params, config)
    manifest = json.loads(Path(manifest_file).read_text(encoding="utf-8"))
    bases = {config: multitask_settings(params, config, manifest["quora_split"]) for config in configs}
    tables = {key: table for key, table in load_tables(Path(tokenized_dir)).items() if key[1] == "train"}
    features = (
        ProbeFeatures(features_dir) if features_dir is not None and Path(features_dir).is_dir() else None
    )
    checkpoint_dir = resolve_checkpoint(params["checkpoint"])
    out = Path(out)
    study = (
        json.loads(out.read_text(encoding="utf-8"))
        if out.is_file()
        else {"command": "minbert lr-search", "runs": [], "chosen": {}}
    )
    for config, base in bases.items():
        base = replace(base, test_predictions=False)
        for lr, head_lr in itertools.product(lrs, head_lrs):
            console.log(f"lr-search {config}: {base.optimizer} lr {lr:g}, head_lr {head_lr:g}")
            settings = replace(base, lr=float(lr), head_lr=float(head_lr))
            point = search_point(settings, checkpoint_dir, tables, device, features)
            key = {
                "scale": params["scale"],
                "config": config,
                "optimizer": base.optimizer,
                "lr": float(lr),
                "head_lr": float(head_lr),
            }
            study["runs"] = [r for r in study["runs"] if {k: r.get(k) for k in key} != key]
            study["runs"].append({**key, "seed": base.seed, **point})
            console.log(f"  validation selection score {point[SCORE]:.4f} (epoch {point['best_epoch']})")
        study["chosen"] = chosen(study["runs"])
        atomic_write_text(out, json.dumps(study, indent=2) + "\n")
    return study


def chosen(runs: list[dict]) -> dict:
    """Per scale, configuration and optimizer, the point with the best validation
    selection score (a tie keeps the smaller learning rates: the gentler update)."""
    best: dict = {}
    for run in sorted(runs, key=lambda r: (r["lr"], r["head_lr"])):
        name = f"{run['scale']}/{run['config']}/{run['optimizer']}"
        if name not in best or run[SCORE] > best[name][SCORE]:
            best[name] = {k: run[k] for k in ("scale", "config", "optimizer", "lr", "head_lr")}
            best[name][SCORE] = fixed(run[SCORE])
    return dict(sorted(best.items()))
