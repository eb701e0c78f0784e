"""Every run's and study's files, typed both ways: ``training``, the stages' runs (their
parts: ``record_parts``); ``study_files``, the seed study, the learning-rate search, the
MLM study and the SMART measurement; ``gpu_calls``, the GPU study's provenance. Each
module is imported on its own, so a stage's code is only the files it writes through.
Torch-free."""
