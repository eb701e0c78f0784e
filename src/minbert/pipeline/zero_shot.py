"""Stage ``zero-shot``: the untrained checkpoint on the full multitask dev sets, the row
fine-tuning starts from (how it is scored: ``minbert.evaluate.zero_shot``). SST, which no
vector answers without a head, is the frozen checkpoint's probe: the SST head every
configuration fits on the frozen encoder before it fine-tunes (``minbert.train.start``);
at a scale without that warm-up, the training labels' majority class."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minbert.data.batches import TokenizedTable
from minbert.data.multitask import TaskData
from minbert.evaluate.multitask import evaluate_multitask
from minbert.evaluate.zero_shot import zero_shot
from minbert.metrics import fixed
from minbert.model.bert import BertModel
from minbert.pipeline import outputs
from minbert.pipeline.entry import stage_main
from minbert.pipeline.stage import started
from minbert.runs.record_parts import Checkpoint, DataSplit, ZeroShotRecordedSettings
from minbert.runs.training import ZeroShotRunFile, write_run
from minbert.settings import RunContext, RunStart
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS
from minbert.train.head_warmup import ProbeFeatures
from minbert.train.start import start


def run(
    resolved: dict,
    tokenized: Path,
    manifest: Path,
    metrics: Path,
    predictions: Path,
    features: Path | None = None,
) -> dict:
    """Score the untrained checkpoint on the tokenised dev tables; write its metrics file
    (``metrics``: the file), its record beside it (``minbert.results``) and its dev
    predictions (under ``predictions``). ``manifest``: the data stage's; ``features``: the
    head warm-up's vectors, which SST's probe is fitted on."""
    tokenized_dir, predictions_dir, metrics_file = map(Path, (tokenized, predictions, metrics))
    probe_settings = RunStart.from_dict(resolved["sst_probe"])
    context = RunContext.of(resolved)
    with started(context, "zero-shot") as stage:
        tables = {
            (t, s): TokenizedTable.read(tokenized_dir / f"{t}-{s}.parquet")
            for t in MULTITASK_TASKS
            for s in ("train", "dev")
        }
        frozen = (
            None
            if features is None
            else ProbeFeatures(features, stage.checkpoint["sha256"], resolved["pooling"])
        )
        result = zero_shot(
            BertModel.from_pretrained(stage.checkpoint_dir),
            tables,
            pooling=resolved["pooling"],
            quora_train_pairs=resolved["quora_train_pairs"],
            batch_size=resolved["eval_batch_size"],
            device=stage.device,
            seed=resolved["seed"],
            dev_vectors=_dev_vectors(frozen, tables, ("quora", "sts"), siamese=True),
        )
        warmup = probe_settings.head_warmup
        if warmup.epochs and "sst" in warmup.tasks:
            model, data, fitted = start(
                probe_settings,
                BertModel.from_pretrained(stage.checkpoint_dir),
                tables,
                stage.device,
                features=frozen,
            )
            sst = {"sst": data.dev["sst"]}
            _, probe = evaluate_multitask(
                model, sst, probe_settings.eval_batch_size, stage.device,
                vectors=_dev_vectors(frozen, tables, ("sst",), siamese=data.dev["sst"].siamese),
            )  # fmt: skip
            result.use_sst_probe(probe["sst"], tables["sst", "dev"].labels, fitted["sst"])
    for task in MULTITASK_TASKS:
        outputs.write_predictions(
            predictions_dir / f"{task}-dev-out.csv", task, tables[task, "dev"].ids, result.predictions[task]
        )
    file = ZeroShotRunFile(
        config="zero-shot",
        scores={
            **{t: fixed(result.scores[TASKS[t].metric_key]) for t in MULTITASK_TASKS},
            AVERAGE: fixed(result.scores[AVERAGE]),
        },
        dev_examples={t: len(tables[t, "dev"]) for t in MULTITASK_TASKS},
        method={
            "sst": result.sst_method,
            "quora": f"cosine of the pooled sentence vectors above {result.quora_threshold:.4f}, the "
            f"most accurate threshold on {result.quora_threshold_pairs} training pairs (accuracy, the "
            "column the row is compared in, so the strongest untrained row there; no constant answer "
            "is a candidate)",
            "sts": "cosine of the pooled sentence vectors, mapped onto 0-5",
        },
        sst_majority_class=result.sst_majority_class,
        pooling=resolved["pooling"],
        data_split=DataSplit.from_dict(
            outputs.data_split(json.loads(Path(manifest).read_text(encoding="utf-8")))
        ),
        checkpoint=Checkpoint.from_dict(stage.checkpoint),
        scale=context.scale,
        seed=resolved["seed"],
        device=stage.device_name,
        settings=ZeroShotRecordedSettings.of(resolved),
    )
    return write_run(file, metrics_file.parent, metrics_file.stem)


def _dev_vectors(
    frozen: ProbeFeatures | None, tables: dict, tasks: tuple[str, ...], siamese: bool
) -> dict[str, torch.Tensor]:
    # The untouched checkpoint's vectors of the dev rows, encoded once by the features stage
    # (what every run's start reads); a task it lacks is encoded here.
    if frozen is None:
        return {}
    return frozen.covered({t: TaskData(t, tables[t, "dev"], siamese) for t in tasks}, "dev")


main = stage_main(run, "tokenized", "manifest", "metrics", "predictions", optional=("features",))
