"""BERT with its masked-language-model head (Devlin et al., 2019: transform, then a decoder
tied to the word embeddings, plus a bias), under Hugging Face's ``BertForMaskedLM``
names, so a pretrained head loads by name and the encoder loads back for fine-tuning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minbert.model.bert import BertConfig, BertModel
from minbert.model.checkpoint import read_state_dict

# The tied decoder weight is the word-embedding matrix itself; checkpoints written
# by Hugging Face may store a copy under this name (or omit it, as here).
TIED_KEY = "cls.predictions.decoder.weight"
DECODER_BIAS_KEY = "cls.predictions.decoder.bias"  # the same tensor as cls.predictions.bias


class PredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class MaskedLMHead(nn.Module):
    """``cls.predictions``: transform, then logits over the vocabulary."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.transform = PredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # Held outside the module tree: the decoder weight is not a parameter of
        # its own but the embedding matrix, so it can never drift from it (no copy
        # to keep in sync after loading or an optimizer step) and state_dict
        # does not list it twice.
        object.__setattr__(self, "_word_embeddings", word_embeddings)

    @property
    def decoder_weight(self) -> torch.Tensor:
        return self._word_embeddings.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(hidden), self.decoder_weight, self.bias)


class _Cls(nn.Module):
    # Only here so that parameter names read ``cls.predictions.*`` as in checkpoints.
    def __init__(self, predictions: MaskedLMHead) -> None:
        super().__init__()
        self.predictions = predictions


class BertForMaskedLM(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = _Cls(MaskedLMHead(config, self.bert.embeddings.word_embeddings))
        self.cls.predictions.apply(self.bert._init_weights)
        self.head_report = "freshly initialised"

    @property
    def head(self) -> MaskedLMHead:
        return self.cls.predictions

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Vocabulary logits at every position, or only at ``positions`` (flat indices): the
        masked 15% are most of what pretraining needs of the head."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        if positions is not None:
            # An index, not a boolean mask: selecting by a mask on a GPU makes the host
            # wait for the device to count the chosen positions.
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        return self.head(hidden)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> BertForMaskedLM:
        """The encoder as :meth:`BertModel.from_pretrained`; the head from
        ``cls.predictions.*`` when the checkpoint has it (every shape checked),
        otherwise BERT's initialisation, and ``head_report`` says which."""
        directory = Path(directory)
        model = cls(BertConfig.from_json(directory / "config.json"))
        state = read_state_dict(directory)
        model.bert.load_report = model.bert.load_checkpoint_state(state, source=str(directory))
        model.head_report = model.load_head_state(state, source=str(directory))
        return model

    def load_head_state(self, state: dict[str, torch.Tensor], source: str) -> str:
        own = {f"cls.predictions.{k}": v for k, v in self.head.state_dict().items()}
        if "cls.predictions.bias" not in state and DECODER_BIAS_KEY in state:
            # Some checkpoints store the output bias only under the decoder's name.
            state = state | {"cls.predictions.bias": state[DECODER_BIAS_KEY]}
        present = {k for k in own if k in state}
        if not present:
            return "not in the checkpoint: freshly initialised"
        if present != set(own):
            # Half a head is a damaged checkpoint, not a choice to fall back from.
            raise ValueError(
                f"{source}: checkpoint has part of the MLM head; missing "
                f"{', '.join(sorted(set(own) - present))}"
            )
        for key, tensor in own.items():
            if tuple(state[key].shape) != tuple(tensor.shape):
                raise ValueError(
                    f"{source}: {key} has shape {tuple(state[key].shape)}, "
                    f"the model expects {tuple(tensor.shape)}"
                )
        if TIED_KEY in state and tuple(state[TIED_KEY].shape) != tuple(self.head.decoder_weight.shape):
            raise ValueError(
                f"{source}: {TIED_KEY} has shape {tuple(state[TIED_KEY].shape)}, "
                f"the word embeddings are {tuple(self.head.decoder_weight.shape)}"
            )
        self.head.load_state_dict({k.removeprefix("cls.predictions."): state[k] for k in own})
        return "loaded from the checkpoint (decoder tied to the word embeddings)"

    def save_pretrained(self, directory: Path, vocab_file: Path, extra_config: dict | None = None) -> None:
        """Write a Hugging Face-format directory: ``config.json``, ``model.safetensors``
        (``bert.*`` and ``cls.predictions.*``; the tied decoder weight is not stored
        twice) and ``vocab.txt``. Fine-tuning stages read it like any checkpoint."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        config = self.config.to_json_dict() | {"architectures": ["BertForMaskedLM"]}
        config |= extra_config or {}
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(directory / "model.safetensors"))
        shutil.copyfile(vocab_file, directory / "vocab.txt")
