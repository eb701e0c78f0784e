"""The encoder: parity with transformers.BertModel, and safe, checked loading."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import BertWordPieceTokenizer

from minbert.model.bert import BertModel
from minbert.model.checkpoint import CheckpointError, read_state_dict

PAIRS = [
    ("A man is playing a guitar on stage.", "Someone plays music in front of a crowd."),
    ("It 's a lovely film with lovely performances .", "Not really."),
    ("What is the best way to learn machine learning?", "How should I start learning ML?"),
]


def _batch(vocab_file):
    tok = BertWordPieceTokenizer(str(vocab_file), lowercase=True)
    enc = tok.encode_batch(PAIRS)
    width = max(len(e.ids) for e in enc)
    assert min(len(e.ids) for e in enc) < width, "the batch must contain padding"

    def padded(rows):
        return torch.tensor([r + [0] * (width - len(r)) for r in rows])

    ids = padded([e.ids for e in enc])
    mask = padded([[1] * len(e.ids) for e in enc])
    types = padded([e.type_ids for e in enc])
    assert set(types[mask.bool()].tolist()) == {0, 1}, "both segment ids must occur"
    return ids, mask, types


def test_outputs_match_transformers(minilm_dir):
    transformers = pytest.importorskip("transformers")
    ids, mask, types = _batch(minilm_dir / "vocab.txt")
    ours = BertModel.from_pretrained(minilm_dir).eval()
    for implementation in ("sdpa", "eager"):
        theirs = transformers.BertModel.from_pretrained(
            str(minilm_dir), attn_implementation=implementation
        ).eval()
        with torch.no_grad():
            a = ours(ids, attention_mask=mask, token_type_ids=types)
            b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types)
        real = mask.bool()
        # Padding positions carry no meaning in either model: compare real tokens.
        torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)


def test_padding_does_not_change_real_tokens(minilm_dir):
    model = BertModel.from_pretrained(minilm_dir).eval()
    ids, mask, types = _batch(minilm_dir / "vocab.txt")
    n = int(mask[1].sum())
    with torch.no_grad():
        batched = model(ids, mask, types).last_hidden_state[1, :n]
        alone = model(ids[1:2, :n], mask[1:2, :n], types[1:2, :n]).last_hidden_state[0]
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)


def _copy_checkpoint(src, dst, state=None, config_update=None):
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    config.update(config_update or {})
    (dst / "config.json").write_text(json.dumps(config))
    shutil.copy(src / "vocab.txt", dst / "vocab.txt")
    if state is not None:
        save_file(state, str(dst / "model.safetensors"))


def test_shape_mismatch_is_named(minilm_dir, tmp_path):
    state = read_state_dict(minilm_dir)
    state["encoder.layer.2.attention.self.key.weight"] = torch.zeros(384, 383)
    _copy_checkpoint(minilm_dir, tmp_path / "ck", state)
    with pytest.raises(ValueError, match=r"encoder.layer.2.attention.self.key.weight has shape \(384, 383\)"):
        BertModel.from_pretrained(tmp_path / "ck")


def test_missing_and_unexpected_keys(minilm_dir, tmp_path):
    state = read_state_dict(minilm_dir)
    # Task-model prefix and an extra head: loaded and reported, respectively.
    state = {f"bert.{k}": v for k, v in state.items()}
    state["cls.predictions.bias"] = torch.zeros(30522)
    del state["bert.pooler.dense.weight"], state["bert.pooler.dense.bias"]
    _copy_checkpoint(minilm_dir, tmp_path / "ck", state)
    model = BertModel.from_pretrained(tmp_path / "ck")
    assert model.load_report.unexpected == ["cls.predictions.bias"]
    assert model.load_report.missing == ["pooler.dense.bias", "pooler.dense.weight"]

    del state["bert.encoder.layer.0.output.dense.weight"]
    shutil.rmtree(tmp_path / "ck")
    _copy_checkpoint(minilm_dir, tmp_path / "ck", state)
    with pytest.raises(ValueError, match="lacks 1 weights: encoder.layer.0.output.dense.weight"):
        BertModel.from_pretrained(tmp_path / "ck")


def test_pytorch_bin_loads_with_weights_only(minilm_dir, tmp_path):
    _copy_checkpoint(minilm_dir, tmp_path / "ck")
    torch.save(read_state_dict(minilm_dir), tmp_path / "ck" / "pytorch_model.bin")
    ours = BertModel.from_pretrained(tmp_path / "ck")
    ref = BertModel.from_pretrained(minilm_dir)
    for (k, a), b in zip(ours.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k


class _RunsCode:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


def test_code_executing_pickle_is_refused(minilm_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _copy_checkpoint(minilm_dir, tmp_path / "ck")
    with open(tmp_path / "ck" / "pytorch_model.bin", "wb") as f:
        pickle.dump({"embeddings.word_embeddings.weight": _RunsCode()}, f)
    with pytest.raises(CheckpointError, match="refused to load"):
        BertModel.from_pretrained(tmp_path / "ck")
    assert not (tmp_path / "PWNED").exists()


def test_unsupported_variant_is_refused(minilm_dir, tmp_path):
    _copy_checkpoint(minilm_dir, tmp_path / "ck", config_update={"hidden_act": "relu"})
    with pytest.raises(ValueError, match="hidden_act 'relu' is not supported"):
        BertModel.from_pretrained(tmp_path / "ck")


def test_fused_qkv_computes_the_same_and_keeps_the_checkpoint_names(tiny_checkpoint, tmp_path):
    """On a GPU the three attention projections become one matrix; outputs, parameter
    names in state_dict, loading and saving stay those of the checkpoint."""
    from minbert.model.checkpoint import save_pretrained

    plain = BertModel.from_pretrained(tiny_checkpoint).eval()
    fused = BertModel.from_pretrained(tiny_checkpoint).eval()
    fused.fuse_qkv()
    assert fused.encoder.layer[0].attention.self.qkv.weight.shape == (3 * 32, 32)
    assert not hasattr(fused.encoder.layer[0].attention.self, "query")
    ids = torch.randint(5, 1000, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    torch.testing.assert_close(
        fused(ids, mask).last_hidden_state, plain(ids, mask).last_hidden_state, atol=1e-5, rtol=1e-5
    )
    assert list(fused.state_dict()) == list(plain.state_dict())
    for name, value in plain.state_dict().items():
        assert torch.equal(fused.state_dict()[name], value), name
    # Saved and loaded as any checkpoint; a fused model loads a plain state dict too.
    save_pretrained(fused, tmp_path / "saved", tiny_checkpoint / "vocab.txt")
    again = BertModel.from_pretrained(tmp_path / "saved")
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), plain.state_dict().values()))
    other = BertModel.from_pretrained(tiny_checkpoint)
    other.fuse_qkv()
    other.load_state_dict(plain.state_dict())
    # Training sees one parameter per fused matrix, and gradients reach it.
    fused.train()
    fused(ids, mask).last_hidden_state.sum().backward()
    assert fused.encoder.layer[1].attention.self.qkv.weight.grad.abs().sum() > 0
