"""How relevant each unit is to the question: a dense score, a lexical one and exact matches.

LongLLMLingua (Jiang et al., ACL 2024) ranks documents by how well each conditions the
question; with the models the gateway has, the coarse ranking combines three signals, each
one number per unit:

- ``dense``: cosine between the question's and the unit's all-MiniLM-L6-v2 embeddings
  (Reimers & Gurevych, EMNLP 2019), one batched call to the :data:`~gateway.embedding.Embed`
  passed in. MiniLM reads at most 256 word pieces anyway; each unit is cut to its first
  ``Weights.embed_chars`` characters, since the embedding's cost on a CPU grows with its
  length and the start of a passage (its title, its first sentence) says what it is about.
  A unit whose start is mostly protected spans (ids, numbers, code: at least
  ``Weights.max_protected`` of its characters) is not embedded: a sentence embedding of a
  UUID means little, and 75 key-value records would cost 200 ms per 1k tokens on a 2-core
  CPU. It gets the mean cosine of the units that were, which neither favours nor hurts it.
- ``lexical``: Okapi BM25 (Robertson & Zaragoza 2009, Lucene's variant, through ``bm25s``)
  with the units as the corpus and the question as the query, divided by the context's best
  score, so in [0, 1].
- ``exact``: the share of the question's protected spans (identifiers, numbers, quoted
  strings: :func:`gateway.compression.units.protected_spans`) found verbatim in the unit;
  with a weight, a key asked for by its id wins whatever the two scores above say.

The weights were tuned on the dev halves of NQ-open and KV retrieval
(``bench/compression.py --tune``; see :data:`WEIGHTS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gateway.compression.units import protected_spans
from gateway.embedding import Embed

__all__ = ["WEIGHTS", "Weights", "dense", "exact", "lexical", "relevance"]


@dataclass(frozen=True, slots=True)
class Weights:
    """score = dense x cosine + lexical x BM25 / best BM25 + exact x share of exact matches.
    ``embed_chars``: how much of each unit is embedded (characters)."""

    dense: float = 1.0
    lexical: float = 0.25
    exact: float = 0.0
    embed_chars: int = 100
    max_protected: float = 0.5


#: The defaults, tuned on dev (1,338 NQ contexts, 100 KV): every row of the grid that keeps
#: the gold passage of all NQ contexts at 4x and 2x and the asked record of all KV ones
#: embeds 100, 200 or 400 characters; the cheapest, 100, ranks the gold first or second
#: (mean reciprocal rank 0.996, 0.998 at 400). Exact matches earn no weight on this data
#: (any weight lowers NQ's reciprocal rank a little; BM25 already finds a UUID key by its
#: pieces) and stay a knob. Without the embedding (BM25 and exact matches) 98.2% of NQ
#: gold passages stay at 4x.
WEIGHTS = Weights()


async def relevance(texts: Sequence[str], question: str, embed: Embed | None,
                    weights: Weights = WEIGHTS) -> np.ndarray:
    """[len(texts)] float64 scores, higher is more relevant; without ``embed`` (or with a
    zero dense weight) no embedding is computed."""
    score = weights.lexical * lexical(texts, question)
    if weights.exact:
        score += weights.exact * exact(texts, question)
    if embed is not None and weights.dense:
        heads = [t[:weights.embed_chars] for t in texts]
        wordy = [i for i, h in enumerate(heads) if _protected_share(h) < weights.max_protected]
        if wordy:
            cosine = await dense([heads[i] for i in wordy], question, embed,
                                 weights.embed_chars)
            scores = np.full(len(texts), cosine.mean())
            scores[wordy] = cosine
            score += weights.dense * scores
    return score


async def dense(texts: Sequence[str], question: str, embed: Embed, chars: int) -> np.ndarray:
    """[len(texts)] cosines in [-1, 1]: one ``embed`` call over the question and each text's
    first ``chars`` characters (the embedder returns unit vectors)."""
    vectors = np.asarray(await embed([question, *(t[:chars] for t in texts)]), np.float64)
    scores: np.ndarray = vectors[1:] @ vectors[0]
    return scores


def lexical(texts: Sequence[str], question: str) -> np.ndarray:
    """[len(texts)] BM25 scores of the question against the texts, over the best: in [0, 1]
    (all zero when no query term occurs)."""
    import bm25s  # imported here: only compression needs it

    out = np.zeros(len(texts))
    query = bm25s.tokenize([question], stopwords="en", show_progress=False,
                           return_ids=False)[0]
    if not query or not texts:
        return out
    corpus = bm25s.tokenize(list(texts), stopwords="en", show_progress=False,
                            return_ids=False)
    if not any(corpus):
        return out
    index = bm25s.BM25()
    index.index(corpus, show_progress=False)
    scores = np.asarray(index.get_scores(query), np.float64)
    best = scores.max()
    return scores / best if best > 0 else out


def _protected_share(text: str) -> float:
    return sum(e - s for s, e in protected_spans(text)) / len(text) if text else 1.0


def exact(texts: Sequence[str], question: str) -> np.ndarray:
    """[len(texts)] share in [0, 1] of the question's protected spans (quotes stripped, each
    distinct span once) that occur verbatim in each text; zeros when it has none."""
    spans = {question[s:e].strip('"') for s, e in protected_spans(question)} - {""}
    if not spans:
        return np.zeros(len(texts))
    return np.array([sum(span in text for span in spans) / len(spans) for text in texts])
