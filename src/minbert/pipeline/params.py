"""``params.yaml`` resolved into each stage's typed settings (``minbert.settings``), which
the ``resolve`` stage writes, one file per stage: what a stage reads there is what it
runs. Needs no torch."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

from minbert.pipeline.schema import ParamsError, config_values, read, validate
from minbert.settings import (
    HeadWarmup,
    MlmSettings,
    MultitaskSettings,
    RunStart,
    SentimentSettings,
    SmartSettings,
)

__all__ = [
    "QUORA_OFFICIAL_TRAIN_PAIRS",
    "head_warmup",
    "load",
    "mlm_settings",
    "multitask_settings",
    "quora_batch_size",
    "resolve_all",
    "resolve_features",
    "resolve_mlm",
    "resolve_multitask",
    "resolve_sentiment",
    "resolve_tokenize",
    "resolve_zero_shot",
    "scale",
    "sentiment_settings",
]


def load(path: str | Path = "params.yaml") -> dict:
    """The whole parameters file, every key checked."""
    return validate(read(path), str(Path(path)))


def scale(params: dict) -> dict:
    """The settings of the chosen scale (``cpu`` or ``paper``)."""
    return params["scales"][params["scale"]]


def _settings(cls, **values):
    """``cls`` built from ``values``, its float fields as floats: YAML writes ``1`` for
    1.0, and equal settings must give equal settings files."""
    floats = {f.name for f in fields(cls) if str(f.type).startswith("float")}
    return cls(**{k: float(v) if k in floats and v is not None else v for k, v in values.items()})


def sentiment_settings(params: dict, run: str) -> SentimentSettings:
    runs = params["sentiment"]["runs"]
    if run not in runs:
        raise ParamsError(f"sentiment run {run!r} is not one of {sorted(runs)}")
    spec = runs[run]
    common = params["sentiment"]
    sized = scale(params)["sentiment"]
    task, mode = spec["task"], spec["mode"]
    return _settings(
        SentimentSettings,
        task=task,
        mode=mode,
        lr=spec["lr"],
        epochs=sized["epochs"][mode],
        patience=sized["patience"][mode],
        **{k: sized[k][task] for k in ("batch_size", "train_examples", "validation_examples")},
        **{k: sized[k] for k in ("dropout", "max_tokens", "test_predictions")},
        **{k: common[k] for k in ("eval_batch_size", "weight_decay", "optimizer", "lr_schedule")},
        lr_gamma=common.get("lr_gamma", 1.0),  # read by the exponential schedule only
        grad_clip=common["grad_clip"],
        # Full fine-tuning's head may learn faster than the encoder (``head_lr``);
        # with only the head training, the run's own lr is the head's.
        head_lr=None if mode == "last-layer" else sized["head_lr"],
        seed=params["seed"],
        pooling=scale(params)["pooling"],
    )


# Quora's official training pairs (the paper's Section 4.1: 141,506 / 20,215 / 40,431):
# the number its batch of 36 was sized for.
QUORA_OFFICIAL_TRAIN_PAIRS = 141_506


def quora_batch_size(batch: int, sized: dict, quora_split: dict | None) -> int:
    """The Quora batch for a configured ``batch``: as configured with the official split,
    the ``fixed`` rule or a training subset; with a carved split and
    ``paper-proportions``, scaled by carved / official training pairs, so that each task's
    batches per epoch keep the paper's proportions (SST 4,272, Quora 3,931, STS 3,020 at
    2 / 36 / 2; an unscaled 36 would repeat the carved pairs 9.5 times per epoch)."""
    if sized["carved_quora_batch"] == "fixed" or sized["train_examples"]["quora"]:
        return batch
    if quora_split is None:
        raise ParamsError("carved_quora_batch: paper-proportions needs the data stage's Quora split")
    if quora_split["kind"] == "official":
        return batch
    pairs = quora_split["train_pairs"] - sized["validation_examples"]["quora"]
    return max(1, round(batch * pairs / QUORA_OFFICIAL_TRAIN_PAIRS))


def head_warmup(params: dict) -> HeadWarmup:
    """The scale's head warm-up; a key left out keeps its default (a scale without a
    warm-up sets ``epochs: 0`` alone)."""
    given = scale(params)["multitask"]["head_warmup"]
    return _settings(HeadWarmup, **{k: tuple(v) if k == "tasks" else v for k, v in given.items()})


def family_rates(params: dict, values: dict) -> dict:
    """The rates (lr, head_lr) the configuration's family has for its optimizer at the
    scale; none: the optimizer's own."""
    rates = scale(params)["multitask"]["rates"]
    return dict(rates.get(values["rate_family"], {}).get(values["optimizer"], {}))


def multitask_settings(
    params: dict, config: str | None, quora_split: dict | None = None
) -> MultitaskSettings:
    """A configuration's settings (``None``: the shared defaults'); ``quora_split``: the data
    stage's manifest's, which the Quora batch depends on under ``carved_quora_batch:
    paper-proportions``."""
    values = config_values(params, config)
    common, sized = params["multitask"], scale(params)["multitask"]
    smart = values["smart"]
    # The schedule and the weight decay belong to the optimizer; so do the learning rates,
    # unless the configuration's family has its own for that optimizer (`minbert lr-search`).
    optimizer = sized["optimizers"][values["optimizer"]]
    optimizer = {**optimizer, **family_rates(params, values)}
    batch_size = dict(sized["batch_size"])
    batch_size["quora"] = quora_batch_size(batch_size["quora"], sized, quora_split)
    return _settings(
        MultitaskSettings,
        **{k: values[k] for k in ("paraphrase_head", "sts_head", "sts_output", "gradient", "optimizer")},
        **{k: optimizer[k] for k in ("lr", "head_lr", "weight_decay", "lr_schedule")},
        lr_gamma=optimizer.get("lr_gamma", 1.0),
        batch_size=batch_size,
        batches_per_step=values["batches_per_step"],
        **{k: dict(sized[k]) for k in ("train_examples", "validation_examples", "history_examples")},
        **{k: sized[k] for k in ("epochs", "carved_quora_batch", "test_predictions", "dropout")},
        cuda_graphs=sized["cuda_graphs"],
        max_tokens=sized["max_tokens"],
        head_warmup=head_warmup(params),
        **{k: common[k] for k in ("grad_clip", "compile")},
        eval_batch_size=sized["eval_batch_size"],
        seed=params["seed"],
        pooling=scale(params)["pooling"],
        smart=_settings(SmartSettings, **{k: v for k, v in smart.items() if k != "enabled"})
        if smart["enabled"]
        else None,
    )


def mlm_settings(params: dict, start: str) -> MlmSettings:
    common = params["mlm"]
    if start not in common["starts"]:
        raise ParamsError(f"MLM start {start!r} is not one of {sorted(common['starts'])}")
    spec = dict(common["starts"][start])
    sized = scale(params)["mlm"]
    return _settings(
        MlmSettings,
        start=start,
        lr=spec.pop("lr"),
        **{k: sized[k] for k in ("epochs", "batch_size", "max_length", "sequences")},
        **{k: common[k] for k in ("heldout_fraction", "mask_prob", "weight_decay", "grad_clip")},
        sources=tuple(common["sources"]),
        scratch_config=spec,  # the fresh model's size (scratch only)
        seed=params["seed"],
    )


# ----------------------------------------------------------------------------- resolved


def _run_context(params: dict) -> dict:
    return {"checkpoint": params["checkpoint"], "device": params["device"], "scale": params["scale"]}


def resolve_sentiment(params: dict, run: str) -> dict:
    return {"run": run, **_run_context(params), "settings": asdict(sentiment_settings(params, run))}


def resolve_multitask(params: dict, config: str, quora_split: dict) -> dict:
    # The tokenised lengths travel with the fine-tuned model, for predicting new text.
    return {
        "config": config,
        **_run_context(params),
        "max_length": scale(params)["max_length"],
        "settings": asdict(multitask_settings(params, config, quora_split)),
    }


def resolve_mlm(params: dict, start: str) -> dict:
    return {"start": start, **_run_context(params), "settings": asdict(mlm_settings(params, start))}


def resolve_zero_shot(params: dict, quora_split: dict) -> dict:
    # SST's probe: the head every configuration fits on the frozen checkpoint, on the same
    # rows with the same settings (the shared defaults'), before it fine-tunes.
    return {
        **_run_context(params),
        "seed": params["seed"],
        "pooling": scale(params)["pooling"],
        "quora_train_pairs": params["zero_shot"]["quora_train_pairs"],
        "eval_batch_size": scale(params)["multitask"]["eval_batch_size"],
        "sst_probe": asdict(RunStart.of(multitask_settings(params, None, quora_split))),
    }


def resolve_features(params: dict) -> dict:
    """The head warm-up's vectors: the tasks it fits at this scale (none without a
    warm-up), of the training and validation rows the runs of this seed take (every
    configuration takes the same) and of dev."""
    warmup, sized = head_warmup(params), scale(params)["multitask"]
    return {
        **_run_context(params),
        "pooling": scale(params)["pooling"],
        "eval_batch_size": sized["eval_batch_size"],
        "tasks": list(warmup.tasks) if warmup.epochs else [],
        "seed": params["seed"],
        **{k: dict(sized[k]) for k in ("train_examples", "validation_examples")},
    }


# What Table 1's frozen vectors depend on besides the checkpoint (the sentiment-features
# stage): a run whose settings differ in any of these reads none of them.
SENTIMENT_FEATURES_MADE_WITH = ("seed", "validation_examples", "train_examples", "eval_batch_size")
SENTIMENT_FEATURES_MADE_WITH += ("max_tokens", "pooling")


def resolve_sentiment_features(params: dict) -> dict:
    # Per task of Table 1: what its runs' frozen vectors depend on (set per task or per
    # scale, so its runs agree) and whether a run predicts test.
    tasks: dict = {}
    for run in params["sentiment"]["runs"]:
        settings = asdict(sentiment_settings(params, run))
        made_with = {k: settings[k] for k in SENTIMENT_FEATURES_MADE_WITH}
        entry = tasks.setdefault(settings["task"], {**made_with, "test_predictions": False})
        entry["test_predictions"] |= settings["test_predictions"] and settings["mode"] == "last-layer"
    return {**_run_context(params), "tasks": tasks}


def resolve_tokenize(params: dict) -> dict:
    return {"checkpoint": params["checkpoint"], "max_length": scale(params)["max_length"]}


def resolve_all(params: dict, manifest: dict) -> dict[str, dict]:
    """Every stage's settings file (name -> content), from ``params`` and the data stage's
    ``manifest``. A stage depends on its own file, so a change reruns exactly the stages
    whose settings it changes."""
    quora_split = manifest["quora_split"]
    out = {
        "tokenize.json": resolve_tokenize(params),
        "zero-shot.json": resolve_zero_shot(params, quora_split),
        "features.json": resolve_features(params),
        "sentiment-features.json": resolve_sentiment_features(params),
    }
    out.update(
        {f"sentiment/{run}.json": resolve_sentiment(params, run) for run in params["sentiment"]["runs"]}
    )
    out.update({f"multitask/{c}.json": resolve_multitask(params, c, quora_split) for c in params["configs"]})
    out.update({f"mlm/{start}.json": resolve_mlm(params, start) for start in params["mlm"]["starts"]})
    return out
