"""BERT's MLM corruption (Devlin et al., 2019): 15% of the non-special tokens are chosen;
80% of them become [MASK], 10% a random token, 10% stay. The loss reads the chosen
positions only; masks are drawn anew for every batch from a seeded generator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
IGNORE = -100  # label of a position that is not predicted (cross_entropy's ignore_index)


@dataclass(frozen=True)
class Vocabulary:
    size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    special_ids: tuple[int, ...]

    @classmethod
    def read(cls, vocab_file: Path) -> Vocabulary:
        tokens = Path(vocab_file).read_text(encoding="utf-8").splitlines()
        index = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in SPECIAL if t not in index]
        if missing:
            raise ValueError(f"{vocab_file}: vocabulary lacks special tokens {missing}")
        # [unusedN] and the like are never produced by the tokenizer; a random
        # replacement drawn from them would teach nothing, so they count as special.
        special = tuple(
            i for t, i in index.items() if t in SPECIAL or (t.startswith("[") and t.endswith("]"))
        )
        return cls(
            size=len(tokens),
            pad_id=index["[PAD]"],
            cls_id=index["[CLS]"],
            sep_id=index["[SEP]"],
            mask_id=index["[MASK]"],
            special_ids=special,
        )

    def replacement_ids(self) -> torch.Tensor:
        """Ids a "random token" replacement is drawn from: every non-special token."""
        keep = torch.ones(self.size, dtype=torch.bool)
        keep[list(self.special_ids)] = False
        return keep.nonzero().squeeze(1)


def mask_tokens(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    *,
    vocab: Vocabulary,
    generator: torch.Generator,
    mask_prob: float = 0.15,
    replacement_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)`` of a batch (``maskable``: tokens that may be chosen); labels hold
    the original ids at chosen positions, ``IGNORE`` elsewhere."""
    if not 0.0 < mask_prob < 1.0:
        raise ValueError(f"mask_prob must be in (0, 1), got {mask_prob}")
    if replacement_ids is None:
        replacement_ids = vocab.replacement_ids()
    shape = input_ids.shape
    chosen = (torch.rand(shape, generator=generator) < mask_prob) & maskable
    # One draw decides the fate of a chosen token: [0, .8) mask, [.8, .9) random, [.9, 1) keep.
    fate = torch.rand(shape, generator=generator)
    to_mask = chosen & (fate < 0.8)
    to_random = chosen & (fate >= 0.8) & (fate < 0.9)
    random_tokens = replacement_ids[torch.randint(len(replacement_ids), shape, generator=generator)]
    inputs = input_ids.clone()
    inputs[to_mask] = vocab.mask_id
    inputs[to_random] = random_tokens[to_random]
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE))
    return inputs, labels


def maskable_positions(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab: Vocabulary
) -> torch.Tensor:
    """True at real tokens that are not special."""
    special = torch.isin(input_ids, torch.tensor(vocab.special_ids, dtype=input_ids.dtype))
    return attention_mask.bool() & ~special
