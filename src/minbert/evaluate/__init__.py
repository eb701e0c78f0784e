"""Scoring a model on data, in inference mode, on length-sorted batches (the least
padding), in evaluation mode, leaving the model's mode as it found it:

* ``multitask``: the multitask model on its dev, slice or test tables;
* ``sentiment``: an encoder's pooled features and a sentiment model's logits;
* ``zero_shot``: the untrained checkpoint's scores on the multitask dev sets.
"""
