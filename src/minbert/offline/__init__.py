"""The pipeline where DVC is not (docs/gpu-node.md): ``plan`` and ``bundle`` on the DVC
machine, ``runner`` and ``parts`` on the node, ``gpu_results`` back on the DVC machine."""
