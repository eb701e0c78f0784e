"""minbert: a from-scratch BERT encoder and a reproducible fine-tuning pipeline.

The packages are layers; each imports only those below it (``tests/test_structure.py``):
``offline`` (the GPU node) over ``tools`` (the user's commands) over ``pipeline`` (one
adapter per DVC stage) over ``report`` and ``train``, then ``evaluate``, ``model``,
``data``, ``metrics`` and ``tasks``. A module name found in several packages is one
task or stage at each layer, and no other name repeats:

* ``multitask``: its batches (``data``), the shared-encoder model (``model``), its
  fine-tuning (``train``), its scoring (``evaluate``) and its stage (``pipeline``);
* ``sentiment``: its training, scoring and stage; ``zero_shot``: its scoring and stage;
* ``mlm``: the MLM head (``model``), its pretraining (``train``) and its stage;
* ``prepare``, ``tokenize``: the work (``data``) and its stage (``pipeline``).
"""

__version__ = "0.1.0"
