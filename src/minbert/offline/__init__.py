"""Running the pipeline where DVC is not: an offline GPU node, an air-gapped cluster.

On the DVC machine, ``plan`` resolves the stages with DVC's own API for a study's
parameters and ``bundle`` packs the plan with what the node lacks (the course CSV
files, the checkpoint as an fp16 copy). On the node, ``runner`` runs the plan's stages
and packs each stage's results as it finishes (``parts``: a few files small enough to
bring back). Back on the DVC machine, ``gpu_results`` adds each call's stages to one GPU
results folder and says which are current, stale or still missing.
"""
