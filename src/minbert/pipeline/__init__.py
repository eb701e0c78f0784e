"""The stage adapters, the only code that knows ``params.yaml``, DVC's file layout and the
formats of the files stages write: a module per stage of ``dvc.yaml`` (read its settings,
load its inputs, build the model, train or evaluate, write its outputs); ``schema`` and
``params`` read and resolve ``params.yaml``. Every module here runs in some stage; the
user's own commands are ``minbert.tools``. Nothing below this layer imports it."""
