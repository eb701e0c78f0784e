"""The pipeline layer, the only code that knows ``params.yaml``, DVC's file layout and the
formats of the files stages write: a module per stage of ``dvc.yaml`` (read its settings,
load its inputs, build the model, train or evaluate, write its outputs), and the tools."""
