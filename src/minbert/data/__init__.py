"""The input layer: the course CSV files, read strictly, turned into Parquet tables,
then into batches.

`tasks` describes the four tasks and their files; `problems`, `csvlines` and `csvfile`
read and validate one file; `download` fetches the files at a pinned commit;
`quora_split` carves Quora's train and held-out parts; `prepare` writes the Parquet
tables and their manifest; `tokenize` adds WordPiece ids; `batches` and `multitask`
turn tables into padded batches; `validation_split` sets training rows aside to choose
on, each label its share (`strata`); `corpus` and `masking` serve MLM pretraining;
`predictions` reads and writes the course's prediction files.
"""
