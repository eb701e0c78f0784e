"""MLM pretraining: masking, the tied head, the corpus, and a tiny pretraining run."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO, TINY

from minbert.data.corpus import build_corpus, pack_sentences
from minbert.data.masking import IGNORE, Vocabulary, mask_tokens, maskable_positions
from minbert.data.tokenize import tokenize_prepared
from minbert.model.bert import BertModel
from minbert.model.mlm import BertForMaskedLM
from minbert.pipeline import mlm
from minbert.pipeline.params import resolve_mlm
from minbert.pipeline.schema import validate
from minbert.results import read_result
from minbert.train.mlm import MaskedBatch, mlm_loss

MASK_PROB = 0.15


@pytest.fixture(scope="module")
def vocab(minilm_dir) -> Vocabulary:
    return Vocabulary.read(minilm_dir / "vocab.txt")


def _draw(vocab, n_rows=400, width=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    replacement = vocab.replacement_ids()
    ids = replacement[torch.randint(len(replacement), (n_rows, width), generator=g)]
    ids[:, 0] = vocab.cls_id
    ids[:, -1] = vocab.sep_id
    ids[::3, width // 2 :] = vocab.pad_id  # padded rows
    mask = (ids != vocab.pad_id).long()
    mask[::3, width // 2 - 1] = 1  # a [SEP] before the padding would be special anyway
    maskable = maskable_positions(ids, mask, vocab)
    inputs, labels = mask_tokens(
        ids, maskable, vocab=vocab, generator=g, mask_prob=MASK_PROB, replacement_ids=replacement
    )
    return ids, maskable, inputs, labels


def test_masking_proportions_within_statistical_bounds(vocab):
    ids, maskable, inputs, labels = _draw(vocab)
    n = int(maskable.sum())
    chosen = labels != IGNORE
    k = int(chosen.sum())
    # Binomial bounds at 5 standard deviations: fails by chance about once in 3 million runs.
    assert abs(k - n * MASK_PROB) < 5 * (n * MASK_PROB * (1 - MASK_PROB)) ** 0.5
    masked = int((chosen & (inputs == vocab.mask_id)).sum())
    unchanged = int((chosen & (inputs == ids)).sum())
    randomised = k - masked - unchanged
    for count, p in ((masked, 0.8), (randomised, 0.1), (unchanged, 0.1)):
        assert abs(count - k * p) < 5 * (k * p * (1 - p)) ** 0.5, (count, k, p)
    # A random replacement is never a special token.
    replaced = chosen & (inputs != vocab.mask_id) & (inputs != ids)
    assert not torch.isin(inputs[replaced], torch.tensor(vocab.special_ids)).any()
    # Labels carry the original token exactly where chosen.
    assert torch.equal(labels[chosen], ids[chosen])


def test_special_and_padding_tokens_are_never_masked(vocab):
    for seed in range(20):
        ids, maskable, inputs, labels = _draw(vocab, n_rows=64, seed=seed)
        special = torch.isin(ids, torch.tensor(vocab.special_ids))
        assert special.any()
        assert (labels[special] == IGNORE).all()
        assert torch.equal(inputs[special], ids[special])
        assert not (labels[~maskable] != IGNORE).any()


def test_masks_are_seeded_and_change_between_draws(vocab):
    a = _draw(vocab, seed=1)[3]
    assert torch.equal(a, _draw(vocab, seed=1)[3])
    assert not torch.equal(a, _draw(vocab, seed=2)[3])


def _tiny_mlm(seed=0):
    torch.manual_seed(seed)
    return BertForMaskedLM(TINY)


def _masked_batch(vocab, seed=0):
    ids, _, inputs, labels = _draw(vocab, n_rows=6, width=20, seed=seed)
    mask = (ids != vocab.pad_id).long()
    return MaskedBatch(inputs, mask, torch.zeros_like(ids), labels)


def test_loss_is_only_on_masked_positions(vocab):
    model = _tiny_mlm().eval()
    batch = _masked_batch(vocab)
    loss, n, _ = mlm_loss(model, batch)
    chosen = batch.labels != IGNORE
    assert 0 < n == int(chosen.sum()) < chosen.numel()
    full = model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    expected = F.cross_entropy(full[chosen], batch.labels[chosen])
    assert torch.allclose(loss, expected, atol=1e-6)
    # Gradient reaches the logits of chosen positions only.
    logits = full.detach().requires_grad_()
    F.cross_entropy(logits.view(-1, logits.shape[-1]), batch.labels.view(-1), ignore_index=IGNORE).backward()
    assert (logits.grad.abs().sum(-1)[~chosen] == 0).all()


def _assert_tied(model: BertForMaskedLM):
    assert model.head.decoder_weight is model.bert.embeddings.word_embeddings.weight
    assert "cls.predictions.decoder.weight" not in model.state_dict()


def test_head_is_tied_after_loading_and_after_an_optimizer_step(tmp_path, vocab, minilm_dir):
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(
        vocab_size=TINY.vocab_size,
        hidden_size=TINY.hidden_size,
        num_hidden_layers=TINY.num_hidden_layers,
        num_attention_heads=TINY.num_attention_heads,
        intermediate_size=TINY.intermediate_size,
    )
    torch.manual_seed(3)
    reference = transformers.BertForMaskedLM(hf_config).eval()
    with torch.no_grad():  # make the head's weights distinguishable from a fresh init
        reference.cls.predictions.bias.normal_()
        reference.cls.predictions.transform.LayerNorm.weight.normal_()
    reference.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())

    model = BertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert model.head_report.startswith("loaded")
    _assert_tied(model)
    batch = _masked_batch(vocab)
    with torch.no_grad():
        ours = model(batch.input_ids, batch.attention_mask)
        theirs = reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert torch.allclose(ours, theirs, atol=1e-5)

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = model.bert.embeddings.word_embeddings.weight.detach().clone()
    mlm_loss(model, batch)[0].backward()
    optimizer.step()
    _assert_tied(model)
    assert not torch.equal(before, model.head.decoder_weight)

    model.save_pretrained(tmp_path / "ours", tmp_path / "hf" / "vocab.txt")
    again = BertForMaskedLM.from_pretrained(tmp_path / "ours")
    _assert_tied(again)
    assert torch.equal(again.head.decoder_weight, model.head.decoder_weight)
    assert torch.equal(again.head.bias, model.head.bias)
    # The same directory is a plain encoder checkpoint for fine-tuning.
    encoder = BertModel.from_pretrained(tmp_path / "ours")
    assert torch.equal(encoder.embeddings.word_embeddings.weight, model.head.decoder_weight)


def test_checkpoint_without_a_head_gets_a_fresh_one(tiny_checkpoint):
    model = BertForMaskedLM.from_pretrained(tiny_checkpoint)
    assert model.head_report.startswith("not in the checkpoint")
    _assert_tied(model)


def test_half_a_head_is_an_error(tmp_path, tiny_checkpoint, minilm_dir):
    from safetensors.torch import load_file, save_file

    model = _tiny_mlm()
    model.save_pretrained(tmp_path, minilm_dir / "vocab.txt")
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["cls.predictions.transform.dense.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="part of the MLM head.*transform.dense.weight"):
        BertForMaskedLM.from_pretrained(tmp_path)


def test_packing_keeps_every_token_and_respects_the_length():
    texts = [np.arange(1000, 1000 + n) for n in (3, 7, 30, 1, 12)]
    packed = list(pack_sentences(texts, 10, cls_id=101, sep_id=102))
    assert all(len(p) <= 10 and p[0] == 101 and p[-1] == 102 for p in packed)
    content = np.concatenate([p[(p != 101) & (p != 102)] for p in packed])
    assert np.array_equal(content, np.concatenate(texts))


# ----------------------------------------------------------------------------- corpus


TRAIN_WORDS = ["good", "bad", "film", "what", "is", "how", "a", "the", "man", "dog"]
HELD_OUT_WORDS = ["zebra", "violin", "harbour", "quartz", "tulip", "glacier"]


def _prepared(directory, n=30):
    directory.mkdir()
    rng = np.random.default_rng(0)

    def sentences(split, count):
        words = TRAIN_WORDS if split == "train" else HELD_OUT_WORDS
        return [" ".join(rng.choice(words, size=rng.integers(2, 40))) for _ in range(count)]

    for split in ("train", "dev", "test"):
        ids = [f"{split}{i}" for i in range(n)]
        lines = np.arange(2, n + 2)
        for task in ("sst", "cfimdb"):
            frame = {"id": ids, "sentence": sentences(split, n), "line": lines}
            if split != "test":
                frame["label"] = rng.integers(0, 5 if task == "sst" else 2, n)
            pd.DataFrame(frame).to_parquet(directory / f"{task}-{split}.parquet")
        for task in ("quora", "sts"):
            if task == "quora" and split == "test":
                continue
            frame = {
                "id": ids,
                "sentence1": sentences(split, n),
                "sentence2": sentences(split, n),
                "line": lines,
            }
            if split != "test":
                frame["label"] = rng.integers(0, 2, n) if task == "quora" else rng.uniform(0, 5, n)
            pd.DataFrame(frame).to_parquet(directory / f"{task}-{split}.parquet")
    (directory / "manifest.json").write_text(json.dumps({"quora_split": {"kind": "carved-from-dev"}}))


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("mlm")
    _prepared(root / "prepared")
    tokenize_prepared(
        root / "prepared",
        root / "tok",
        tiny_checkpoint / "vocab.txt",
        {"sst": 64, "cfimdb": 64, "quora": 64, "sts": 64},
    )
    return root / "tok"


def test_corpus_has_training_text_only(tokenized, vocab, minilm_dir):
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(minilm_dir / "vocab.txt"), lowercase=True)
    held_out = {i for w in HELD_OUT_WORDS for i in tok.encode(w, add_special_tokens=False).ids}
    trained = {i for w in TRAIN_WORDS for i in tok.encode(w, add_special_tokens=False).ids}
    corpus = build_corpus(
        tokenized, ["sst", "cfimdb", "quora", "sts"], 48, cls_id=vocab.cls_id, sep_id=vocab.sep_id
    )
    tokens = set(corpus.input_ids.flat.tolist())
    assert not tokens & held_out
    assert trained <= tokens
    assert set(corpus.counts()) == {"sst", "cfimdb", "quora", "sts"}
    assert corpus.input_ids.lengths().max() <= 48
    # Pairs keep their segment ids: some sequences have a second segment.
    pair_rows = np.flatnonzero(np.isin(corpus.source, ["quora", "sts"]))
    assert any(corpus.token_type_ids[i].max() == 1 for i in pair_rows)


def run_stage(params: dict, start: str, *args):
    """The stage with the settings the resolve stage would write (no resume state: the
    kill-and-resume test is tests/test_resume.py's)."""
    return mlm.run(resolve_mlm(params, start), *args, resume_dir=None)


@pytest.fixture
def mlm_params(tiny_checkpoint):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p.update(checkpoint=str(tiny_checkpoint), device="cpu")
    p["scales"]["cpu"]["mlm"] = {"max_length": 48, "epochs": 2, "batch_size": 8, "sequences": 0}
    p["mlm"]["starts"] = {
        "continue": {"lr": 1e-3},
        "scratch": {
            "lr": 1e-3,
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
        },
    }
    return validate(p)


@pytest.mark.slow
@pytest.mark.parametrize("start", ["continue", "scratch"])
def test_stage_writes_a_checkpoint_that_fine_tuning_reads(tmp_path, tokenized, mlm_params, start):
    metrics = run_stage(mlm_params, start, tokenized, tmp_path / "models", tmp_path / "metrics")
    saved = read_result(tmp_path / "metrics" / f"{start}.json")
    assert saved == json.loads(json.dumps(metrics))
    # The metrics file: the held-out accuracy after pretraining; the record: the rest.
    assert set(json.loads((tmp_path / "metrics" / f"{start}.json").read_text())) == {"accuracy", "steps"}
    assert 0 <= saved["accuracy"] <= 1 and saved["after"]["perplexity"] > 1
    assert 0 <= saved["before"]["masked_accuracy"] <= 1 and saved["before"]["perplexity"] > 1
    assert saved["after"]["masked_tokens"] == saved["before"]["masked_tokens"] > 0
    # The training text is this tiny corpus's few words: two epochs must beat the start.
    assert saved["after"]["perplexity"] < saved["before"]["perplexity"]
    assert saved["corpus"]["heldout_sequences"] >= 1
    history = pd.read_csv(tmp_path / "metrics" / f"{start}-history.csv")
    assert list(history.epoch) == [0, 1, 2]  # epoch 0: the held-out scores before pretraining
    assert history.heldout_perplexity[0] == saved["before"]["perplexity"]
    encoder = BertModel.from_pretrained(tmp_path / "models" / start)
    assert encoder.config.hidden_size == (32 if start == "continue" else 16)
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_pretraining_is_deterministic(tmp_path, tokenized, mlm_params):
    a = run_stage(mlm_params, "continue", tokenized, tmp_path / "a", tmp_path / "ma")
    b = run_stage(mlm_params, "continue", tokenized, tmp_path / "b", tmp_path / "mb")
    assert (a["accuracy"], a["after"]) == (b["accuracy"], b["after"])
