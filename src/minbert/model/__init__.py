"""The encoder (``bert``), task heads (``heads``), the shared-encoder multitask model
(``multitask``), the MLM head (``mlm``) and checkpoint handling (``checkpoint``)."""
