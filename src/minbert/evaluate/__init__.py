"""Scoring a model on data (inference and eval mode, length-sorted batches, the model's mode
restored): ``multitask``, ``sentiment``, ``zero_shot``."""
