"""Task heads on top of the shared encoder."""

from __future__ import annotations

import torch
from torch import nn

from minbert.model.bert import BertModel


class ClassificationHead(nn.Module):
    """Dropout then a linear layer: logits for ``num_classes`` classes."""

    def __init__(self, hidden_size: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(hidden_size, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(self.dropout(features))


class SentimentClassifier(nn.Module):
    """BERT's pooled [CLS] output followed by a classification head."""

    def __init__(self, encoder: BertModel, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = ClassificationHead(encoder.config.hidden_size, num_classes, dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(input_ids, attention_mask).pooler_output)
