"""Question-aware prompt compression: long context cut to a token budget by keeping the
units most relevant to the question, whole (LongLLMLingua's document-level step, Jiang et
al., ACL 2024, with all-MiniLM-L6-v2 and BM25 in place of a language model's perplexity),
and optionally (``token_level``) thinned word by word inside them (LLMLingua's token-level
step, Jiang et al., EMNLP 2023, scored by the local engine's SmolLM2). One module per
concept, pure apart from the embedding and scoring calls:

- :mod:`~gateway.compression.units`: the context split into documents, sections, items,
  paragraphs, code and JSON blocks or records; protected spans; writing a subset back.
- :mod:`~gateway.compression.rank`: each unit's relevance to the question.
- :mod:`~gateway.compression.select`: the budget, the units that fit, their order.
- :mod:`~gateway.compression.fine`: the fine pass: the least informative words dropped.
- :mod:`~gateway.compression.scoring`: its scoring call (the engine's ``/v1/completions``).
- :mod:`~gateway.compression.tokens`: token counters.
- :mod:`~gateway.compression.compress`: :func:`compress`, the entry point.
"""

from gateway.compression.compress import Result, compress

__all__ = ["Result", "compress"]
