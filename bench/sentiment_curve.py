"""Table 1's learning curves: validation MCC per epoch of each full fine-tuning arm, run
past the scale's epochs with every epoch kept, to set the epochs and patience it trains at.

Not a timing target: evidence for the cpu scale's sentiment epochs. Each ``--runs`` entry
(default ``sst-full`` and ``cfimdb-full``) is trained from its resolved settings
(``data/settings/sentiment/<run>.json``, so ``dvc repro`` must have written them) with
``--epochs`` epochs and patience 0: every epoch runs. Per epoch: the training loss and
accuracy, validation MCC and its sampling noise at that level and size
(``minbert.metrics.correlation_noise``), and the run's seconds per epoch. No dev score is
written here: the epochs are chosen on validation alone. ``--train-examples`` trains on that
many rows instead (what a smaller arm would need).
Writes ``bench/results/<--name>.json``.
"""

from __future__ import annotations

import dataclasses
import json
import time

import common

VALIDATION = ("val_loss", "val_accuracy", "val_mcc")


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", default=["sst-full", "cfimdb-full"])
    p.add_argument("--epochs", type=int, nargs="+", default=[6, 8], help="one per run, in order")
    p.add_argument(
        "--train-examples", type=int, default=None, help="training rows instead of the settings' (0: all)"
    )
    p.add_argument("--name", default="sentiment_curve")
    args = p.parse_args()
    common.setup(args, repeats=1, warmup=0)

    from minbert.data.batches import TokenizedTable
    from minbert.device import pin_cpu_kernels
    from minbert.metrics import correlation_noise
    from minbert.model.bert import BertModel
    from minbert.model.checkpoint import resolve_checkpoint
    from minbert.settings import SentimentSettings
    from minbert.train.sentiment import train_sentiment

    pin_cpu_kernels()
    curves = []
    for run, epochs in zip(args.runs, args.epochs, strict=True):
        resolved = json.loads((common.REPO / "data" / "settings" / "sentiment" / f"{run}.json").read_text())
        settings = SentimentSettings.from_dict(resolved["settings"])
        settings = dataclasses.replace(settings, epochs=1 if args.quick else epochs, patience=0)
        if args.train_examples is not None:
            settings = dataclasses.replace(settings, train_examples=args.train_examples)
        tables = {
            split: TokenizedTable.read(common.TOKENIZED / f"{settings.task}-{split}.parquet")
            for split in ("train", "dev")
        }
        encoder = BertModel.from_pretrained(resolve_checkpoint(resolved["checkpoint"]))
        common.console.print(f"[bold]{run}: {settings.epochs} epochs, patience 0[/]")
        began = time.perf_counter()
        result = train_sentiment(settings, encoder, tables["train"], tables["dev"], None, common.CPU)
        seconds = time.perf_counter() - began
        rows = [
            {
                "epoch": h["epoch"],
                "train_loss": h.get("train_loss"),
                "train_accuracy": h.get("train_accuracy"),
                **{k: h[k] for k in VALIDATION},
                "val_mcc_noise": round(correlation_noise(h["val_mcc"], result.validation_examples), 4),
            }
            for h in result.history
        ]
        curves.append(
            {
                "run": run,
                "settings": dataclasses.asdict(settings),
                "train_examples": result.train_examples,
                "validation_examples": result.validation_examples,
                "seconds": round(seconds, 1),
                "seconds_per_epoch": round(seconds / settings.epochs, 1),
                "epochs": rows,
            }
        )
        common.table(
            f"{run}: validation ({result.validation_examples} rows) per epoch",
            ["epoch", "train loss", "train acc", "val MCC", "noise (1 s.d.)", "val acc"],
            [
                [r[k] for k in ("epoch", "train_loss", "train_accuracy", "val_mcc", "val_mcc_noise")]
                + [r["val_accuracy"]]
                for r in rows
            ],
        )
    common.finish(args.name, args, {"curves": curves}, [])


if __name__ == "__main__":
    main()
