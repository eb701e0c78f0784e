"""Training-step throughput of minBERT against transformers.BertModel, on the CPU.

One training step is forward + backward + AdamW step (the package's ``adamw``:
torch AdamW, fused) on a batch of random token ids (no padding; the attention
mask of all ones is passed, as the pipeline always passes one). minBERT
(``minbert.model.BertModel``) and ``transformers.BertModel`` with attention
``sdpa`` and ``eager`` load the same checkpoint, get the same batches and run
interleaved in the same process, next to the CPU's matmul peak measured in the
same run. The loss is ``mean(last_hidden_state^2) + mean(pooler_output^2)`` for
every model: it reaches every parameter and costs nothing next to the encoder.

FLOP count (PaLM, Chowdhery et al. 2022, appendix B), per token of a sequence of
length T, with N = non-embedding parameters = L (4 h^2 + 2 h i) (the Q, K, V,
output and two feed-forward matrices of each of L layers; biases, LayerNorms,
embeddings and the pooler are negligible or not matmuls):

    training  = 6 N + 12 L T h     (forward 2 N + 4 L T h; backward twice that)
    inference = 2 N +  4 L T h

where 4 L T h per token is QK^T and attention-times-V (2 T h multiply-adds each,
every layer). Achieved FLOP/s = FLOP per step / median step time; the fraction
of peak divides it by the matmul peak measured just before.

Also: minBERT's evaluation throughput (eval mode, ``torch.inference_mode``,
batches of ``--eval-batch-size``), in sentences/s, at the same lengths.
"""

from __future__ import annotations

import common
import torch

TARGET_RATIO = 1.0  # minBERT tokens/s >= this x transformers sdpa
TARGET_PEAK = 0.6  # minBERT training FLOP/s >= this fraction of the matmul peak


def train_flop_per_token(config, seq_len: int) -> float:
    return (
        6 * config.num_parameters_non_embedding + 12 * config.num_hidden_layers * seq_len * config.hidden_size
    )


def eval_flop_per_token(config, seq_len: int) -> float:
    return (
        2 * config.num_parameters_non_embedding + 4 * config.num_hidden_layers * seq_len * config.hidden_size
    )


def bert_base_directory(seed: int) -> str:
    """Random weights of bert-base's size (the paper's encoder), saved as a checkpoint
    directory in a temporary folder, so every model loads the same ones."""
    import tempfile
    from pathlib import Path

    from minbert.model.bert import BertConfig, BertModel
    from minbert.model.checkpoint import resolve_checkpoint, save_pretrained

    torch.manual_seed(seed)
    directory = Path(tempfile.mkdtemp(prefix="bert-base-random-"))
    save_pretrained(BertModel(BertConfig()), directory, resolve_checkpoint("all-minilm-l6-v2") / "vocab.txt")
    return str(directory)


def load_models(checkpoint: str) -> dict[str, torch.nn.Module]:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from minbert.model.bert import BertModel
    from minbert.model.checkpoint import resolve_checkpoint

    directory = resolve_checkpoint(checkpoint)
    models = {"minbert": BertModel.from_pretrained(directory)}
    for impl in ("sdpa", "eager"):
        models[f"hf-{impl}"] = transformers.BertModel.from_pretrained(
            str(directory), attn_implementation=impl, dtype=torch.float32
        )
    return models


def random_batch(vocab_size: int, batch: int, seq_len: int, generator: torch.Generator) -> dict:
    ids = torch.randint(1000, vocab_size, (batch, seq_len), generator=generator)  # no special ids
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


@torch.no_grad()
def check_same_weights(models: dict, batch: dict) -> float:
    """Largest difference of the pooled outputs (eval mode) against minBERT's."""
    outs = {name: m.eval()(**batch).pooler_output for name, m in models.items()}
    return max((o - outs["minbert"]).abs().max().item() for o in outs.values())


def train_step(model, optimizer, batch):
    def step():
        out = model(**batch)
        loss = out.last_hidden_state.square().mean() + out.pooler_output.square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def eval_step(model, batch):
    def step():
        with torch.inference_mode():
            model(**batch)

    return step


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint",
        default="all-minilm-l6-v2",
        help="packaged name, Hugging Face-format directory or hub name",
    )
    p.add_argument(
        "--bert-base",
        action="store_true",
        help="random bert-base-sized weights instead of --checkpoint; results go to "
        "train_step_bert_base.json",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-lengths", type=int, nargs="+", default=[64, 128])
    p.add_argument("--eval-batch-size", type=int, default=128)
    p.add_argument("--matmul-size", type=int, default=2048)
    p.add_argument("--lr", type=float, default=1e-5)
    args = p.parse_args()
    if args.quick:
        args.batch_size, args.seq_lengths, args.eval_batch_size, args.matmul_size = 4, [16], 8, 256
    common.setup(args, repeats=10, warmup=3)

    from minbert.train.optim import build_optimizer

    if args.bert_base:
        args.checkpoint = "bert-base (random weights)"
    models = load_models(bert_base_directory(args.seed) if args.bert_base else args.checkpoint)
    config = models["minbert"].config
    optimizers = {
        name: build_optimizer("adamw", m, lr=args.lr, weight_decay=0.0) for name, m in models.items()
    }
    generator = torch.Generator().manual_seed(args.seed)
    max_diff = check_same_weights(models, random_batch(config.vocab_size, 2, 16, generator))
    peak = common.matmul_peak(args.matmul_size, repeats=args.repeats)
    common.console.print(
        f"matmul peak ({args.matmul_size}^2 fp32, {torch.get_num_threads()} threads): "
        f"{peak['flop_per_s'] / 1e9:.1f} GFLOP/s; same weights: max |pooled diff| "
        f"{max_diff:.1e}"
    )

    shapes, rows, targets = [], [], []
    for seq_len in args.seq_lengths:
        batch = random_batch(config.vocab_size, args.batch_size, seq_len, generator)
        for m in models.values():
            m.train()
        timings = common.measure(
            {n: train_step(m, optimizers[n], batch) for n, m in models.items()},
            warmup=args.warmup,
            repeats=args.repeats,
        )
        tokens = args.batch_size * seq_len
        flop = train_flop_per_token(config, seq_len) * tokens
        per_model = {}
        for name, t in timings.items():
            per_model[name] = {
                **t.as_dict(),
                "tokens_per_s": tokens / t.median,
                "flop_per_s": flop / t.median,
                "fraction_of_peak": flop / t.median / peak["flop_per_s"],
            }
        for name, r in per_model.items():
            r["minbert_speedup"] = per_model["minbert"]["tokens_per_s"] / r["tokens_per_s"]
            rows.append(
                [
                    f"train {args.batch_size}x{seq_len}",
                    name,
                    f"{r['median_s'] * 1e3:.1f}",
                    f"{r['tokens_per_s']:,.0f}",
                    f"{r['flop_per_s'] / 1e9:.1f}",
                    f"{r['fraction_of_peak']:.2f}",
                    f"{r['minbert_speedup']:.2f}x",
                ]
            )

        eval_batch = random_batch(config.vocab_size, args.eval_batch_size, seq_len, generator)
        models["minbert"].eval()
        t = common.measure(
            {"minbert": eval_step(models["minbert"], eval_batch)}, warmup=args.warmup, repeats=args.repeats
        )["minbert"]
        eval_flop = eval_flop_per_token(config, seq_len) * args.eval_batch_size * seq_len
        evaluation = {
            **t.as_dict(),
            "sentences_per_s": args.eval_batch_size / t.median,
            "fraction_of_peak": eval_flop / t.median / peak["flop_per_s"],
        }
        rows.append(
            [
                f"eval {args.eval_batch_size}x{seq_len}",
                "minbert",
                f"{t.median * 1e3:.1f}",
                f"{evaluation['sentences_per_s']:,.1f} sent/s",
                f"{eval_flop / t.median / 1e9:.1f}",
                f"{evaluation['fraction_of_peak']:.2f}",
                "",
            ]
        )

        shapes.append(
            {
                "batch_size": args.batch_size,
                "seq_len": seq_len,
                "tokens": tokens,
                "train_flop": flop,
                "train": per_model,
                "eval": {"batch_size": args.eval_batch_size, "flop": eval_flop, **evaluation},
            }
        )
        shape = f"{args.batch_size}x{seq_len}"
        targets.append(
            common.target(
                f"minBERT / HF sdpa tokens/s, {shape}",
                per_model["hf-sdpa"]["minbert_speedup"],
                ">=",
                TARGET_RATIO,
            )
        )
        targets.append(
            common.target(
                f"minBERT fraction of matmul peak, {shape}",
                per_model["minbert"]["fraction_of_peak"],
                ">=",
                TARGET_PEAK,
            )
        )

    common.table(
        "training step (forward + backward + AdamW) and evaluation",
        ["shape", "model", "median ms", "tokens/s", "GFLOP/s", "of peak", "minBERT ÷ this"],
        rows,
    )
    results = {
        "checkpoint": args.checkpoint,
        "config": config.to_json_dict(),
        "non_embedding_params": config.num_parameters_non_embedding,
        "flop_formula": {"train_per_token": "6 N + 12 L T h", "eval_per_token": "2 N + 4 L T h"},
        "same_weights_max_pooled_diff": max_diff,
        "matmul_peak": peak,
        "shapes": shapes,
    }
    common.finish("train_step_bert_base" if args.bert_base else "train_step", args, results, targets)


if __name__ == "__main__":
    main()
