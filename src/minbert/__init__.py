"""minbert: a from-scratch BERT encoder and a reproducible fine-tuning pipeline."""

__version__ = "0.1.0"
