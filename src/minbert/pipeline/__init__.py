"""The pipeline layer: the only code that knows ``params.yaml``, DVC's file layout and
the formats of the files stages write.

Each stage of ``dvc.yaml`` is a thin script in ``stages/`` calling one module here,
and each module here does the same five things in order: read its settings (from
``params.yaml`` through ``settings``, or from the file the ``resolve`` stage wrote),
load its inputs, build the model, call ``minbert.train`` / ``minbert.evaluate``, and
write its outputs through ``outputs``. Nothing below this layer imports it.
"""
