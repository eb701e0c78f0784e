"""The encoder (``bert``), task heads (``heads``) and checkpoint handling (``checkpoint``)."""

from minbert.model.bert import BertConfig, BertModel, BertOutput

__all__ = ["BertConfig", "BertModel", "BertOutput"]
