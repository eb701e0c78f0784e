"""The stage adapters: the only code that knows ``params.yaml``, DVC's file layout and
the formats of the files stages write.

Each stage of ``dvc.yaml`` is a thin script in ``stages/`` calling one module here
(``prepare``, ``resolve``, ``tokenize``, ``features``, ``sentiment``, ``zero_shot``,
``multitask``, ``mlm``, ``report``), and each does the same five things in order: read
its settings (from the file the ``resolve`` stage wrote, through ``entry``), load its
inputs, build the model (``stage``), call ``minbert.train`` / ``minbert.evaluate``, and
write its outputs (``outputs``, ``model_card``). ``schema`` and ``params`` read and
resolve ``params.yaml``. Every module here runs in some stage; the user's own commands
live in ``minbert.tools``. Nothing below this layer imports it.
"""
