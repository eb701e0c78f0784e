"""Running the pipeline where DVC is not: an offline GPU node, an air-gapped cluster.

``bundle`` packs what such a node lacks (the code at a commit, the course CSV files,
the checkpoint as an fp16 copy); ``stages`` reads the stages, their commands and
outputs from ``dvc.yaml`` itself; ``runner`` runs them in ``dvc.yaml``'s order and
packs what they wrote into a few files small enough to copy back; ``results``
unpacks those on the DVC machine into a GPU results folder and says which of them
are stale against the current code.
"""
