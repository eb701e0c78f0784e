"""The BERT encoder, from scratch (Devlin et al., 2019): embeddings and LayerNorm, post-LN
transformer layers, a tanh pooler over [CLS]. Parameter names follow Hugging Face's, so a
checkpoint loads name by name with every shape checked."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from minbert.model.checkpoint import read_state_dict
from minbert.model.dropout import Dropout, attention, in_tiled


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """A Hugging Face ``config.json``; a checkpoint asking for another BERT variant (another
        activation, relative positions) is refused rather than run with the wrong maths."""
        path = Path(path)
        raw = json.loads(path.read_text(encoding="utf-8"))
        act = raw.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"{path}: hidden_act {act!r} is not supported (only 'gelu')")
        pos = raw.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError(f"{path}: position_embedding_type {pos!r} is not supported (only 'absolute')")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def to_json_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(model_type="bert", hidden_act="gelu", position_embedding_type="absolute")
        return d

    @property
    def num_parameters_non_embedding(self) -> int:
        """Parameters touched per token in matmuls (for FLOP estimates)."""
        h, i, n = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        return n * (4 * h * h + 2 * h * i)


class EncoderOutput(NamedTuple):
    """What the encoder returns (Hugging Face's ``BaseModelOutputWithPooling`` fields)."""

    last_hidden_state: torch.Tensor  # (batch, seq, hidden)
    pooler_output: torch.Tensor  # (batch, hidden)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        positions = torch.arange(seq_len, device=input_ids.device)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)  # broadcast over the batch
            + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        # Three projections, as the checkpoint stores them; on a GPU `fuse_qkv` turns
        # them into one matrix (one kernel instead of three; on a CPU it measured no
        # faster, so it stays off there).
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.qkv: nn.Linear | None = None
        self.dropout_p = config.attention_probs_dropout_prob

    def fuse_qkv(self) -> None:
        """Replace the three projections by one (3h x h) matrix. Parameter names stay the
        checkpoint's in ``state_dict`` and ``load_state_dict`` (split and joined by hooks),
        so loading, saving and resuming are unchanged."""
        if self.qkv is not None:
            return
        parts = (self.query, self.key, self.value)
        h = self.query.in_features
        self.qkv = nn.Linear(h, 3 * h, device=self.query.weight.device, dtype=self.query.weight.dtype)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([p.weight for p in parts]))
            self.qkv.bias.copy_(torch.cat([p.bias for p in parts]))
        del self.query, self.key, self.value
        self._register_state_dict_hook(_split_qkv)
        self._register_load_state_dict_pre_hook(_join_qkv)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        b, t, h = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        if self.qkv is None:
            q, k, v = (heads(proj(x)) for proj in (self.query, self.key, self.value))
        else:
            q, k, v = (heads(y) for y in self.qkv(x).split(h, dim=-1))
        y = attention(q, k, v, attn_mask, self.dropout_p if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, t, h)


_QKV = ("query", "key", "value")


def _split_qkv(module, state: dict, prefix: str, local_metadata) -> None:
    """``state_dict`` hook of a fused attention: the checkpoint's three names back."""
    fused = {kind: state.pop(f"{prefix}qkv.{kind}").chunk(3) for kind in ("weight", "bias")}
    for i, name in enumerate(_QKV):  # the checkpoint's order: query.weight, query.bias, key...
        for kind in ("weight", "bias"):
            state[f"{prefix}{name}.{kind}"] = fused[kind][i]


def _join_qkv(state: dict, prefix: str, *args) -> None:
    """``load_state_dict`` pre-hook of a fused attention: three names into one matrix."""
    for kind in ("weight", "bias"):
        names = [f"{prefix}{name}.{kind}" for name in _QKV]
        if all(n in state for n in names):
            state[f"{prefix}qkv.{kind}"] = torch.cat([state.pop(n) for n in names])


class _ProjectAddNorm(nn.Module):
    """Project to the hidden size, dropout, then add the residual and LayerNorm (post-LN):
    the end of both sublayers of a BERT layer."""

    def __init__(self, config: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(y)))


class BertSelfOutput(_ProjectAddNorm):
    """The attention sublayer's output projection (``attention.output.*``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, config.hidden_size)


class BertOutput(_ProjectAddNorm):
    """The feed-forward sublayer's output projection (``output.*``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, config.intermediate_size)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, attn_mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BERT's GELU is the exact erf form, not the tanh approximation.
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention(x, attn_mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        # Inside `tiled` (SMART's passes) a compiled layer runs its own forward: compiled
        # code neither carries the ascent's forward-mode tangents nor draws dropout masks
        # from the global generator that SMART replays.
        eager = in_tiled()
        for layer in self.layer:
            x = layer.forward(x, attn_mask) if eager else layer(x, attn_mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


def attention_mask_for_sdpa(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A (batch, seq) padding mask as SDPA's boolean (batch, 1, 1, seq) "may attend" mask;
    ``None`` when a CPU mask pads nothing (SDPA's fastest kernel; on a GPU the check would
    wait for the device). Padded query rows still attend to real keys: finite outputs."""
    if attention_mask is None or (attention_mask.device.type == "cpu" and bool(attention_mask.all())):
        return None
    return attention_mask[:, None, None, :].bool()


class BertModel(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # BERT's initialisation: truncated-normal-like N(0, 0.02) weights, zero biases,
        # identity LayerNorm. Used for fresh models; from_pretrained overwrites it all.
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The embedding output, which SMART perturbs before :meth:`encode`."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return self.embeddings(input_ids, token_type_ids)

    def encode(self, embedded: torch.Tensor, attention_mask: torch.Tensor | None = None) -> EncoderOutput:
        hidden = self.encoder(embedded, attention_mask_for_sdpa(attention_mask))
        return EncoderOutput(hidden, self.pooler(hidden))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> EncoderOutput:
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                f"{self.config.max_position_embeddings}"
            )
        return self.encode(self.embed(input_ids, token_type_ids), attention_mask)

    def fuse_qkv(self) -> None:
        """One query-key-value matrix per layer (see ``BertSelfAttention.fuse_qkv``)."""
        for layer in self.encoder.layer:
            layer.attention.self.fuse_qkv()

    def compile_layers(self, **options) -> None:
        """``torch.compile`` each layer in place (``dynamic``: lengths change from batch to
        batch), keeping parameter names, ``embed``/``encode`` and saving as they are."""
        for layer in self.encoder.layer:
            layer.compile(dynamic=True, **options)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> BertModel:
        """A Hugging Face-format checkpoint directory (``model.safetensors``, or
        ``pytorch_model.bin`` under ``weights_only``); a ``bert.`` prefix is dropped, other
        heads' keys are ignored, every shape is checked and a missing weight is an error."""
        directory = Path(directory)
        config = BertConfig.from_json(directory / "config.json")
        model = cls(config)
        state = read_state_dict(directory)
        report = model.load_checkpoint_state(state, source=str(directory))
        model.load_report = report
        return model

    def load_checkpoint_state(self, state: dict[str, torch.Tensor], source: str) -> LoadReport:
        own = self.state_dict()
        mapped: dict[str, torch.Tensor] = {}
        unexpected: list[str] = []
        for key, tensor in state.items():
            name = key.removeprefix("bert.")
            # Hugging Face keeps a constant position_ids buffer in some checkpoints;
            # this encoder computes positions on the fly.
            if name == "embeddings.position_ids":
                continue
            if name not in own:
                unexpected.append(key)
                continue
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"{source}: {key} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(own[name].shape)}"
                )
            mapped[name] = tensor
        missing = sorted(set(own) - set(mapped))
        # The pooler is the one part some checkpoints legitimately lack (models
        # saved without it): keep its fresh initialisation then, and say so.
        fatal = [k for k in missing if not k.startswith("pooler.")]
        if fatal:
            raise ValueError(f"{source}: checkpoint lacks {len(fatal)} weights: {', '.join(fatal[:8])}")
        self.load_state_dict(mapped, strict=False)
        return LoadReport(missing=missing, unexpected=sorted(unexpected))


@dataclass
class LoadReport:
    missing: list[str]
    unexpected: list[str]

    def __str__(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing (freshly initialised): {', '.join(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected (ignored): {', '.join(self.unexpected)}")
        return "; ".join(parts) or "all weights loaded, none unexpected"
