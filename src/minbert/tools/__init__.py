"""The user's commands beside ``dvc repro`` (``minbert.cli``), which no stage runs:

* ``predict``: a fine-tuned multitask model on new text or a labelled file;
* ``compare``: DVC experiments side by side, each difference with its interval;
* ``sweep``: seed sweeps over DVC experiments, and the report's seed study;
* ``lr_search``: each learning-rate family's rates over seeds, chosen on the validation split;
* ``reach``: the stages a ``dvc exp run -S`` would rerun, before it runs;
* ``readme``: the README's generated blocks, from the committed metrics.

They read what the stages wrote, or run a stage's code (``minbert.pipeline``) the way
the stage would; nothing in the pipeline imports them.
"""
