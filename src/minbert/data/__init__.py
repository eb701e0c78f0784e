"""The input layer: the course CSV files read strictly (``problems``, ``csvlines``,
``csvfile``, ``download``), carved (``quora_split``; ``validation_split``, by label share:
``strata``), written as Parquet (``prepare``), tokenised (``tokenize``) and batched
(``batches``, ``multitask``, ``corpus``, ``masking``); ``predictions`` holds the course's
output files."""
