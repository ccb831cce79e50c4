"""Do two answers agree? The outcome that teaches the error bound (:mod:`gateway.cache.bound`).

When a request with a semantic candidate goes upstream (a miss, or an exploration), its
fresh answer is compared with the candidate's cached one, after the client has it and off
the request's path:

1. tool calls: the same functions with the same parsed arguments, in order;
2. text: equal once case, whitespace and punctuation are set aside;
3. else the numbers they state (digits, as sets) must be the same, and their embeddings
   (all-MiniLM-L6-v2, the cache's own embedder) at cosine >= ``AGREEMENT``.

Two right answers worded apart can fall below the bar (the outcome is then "wrong": the
bound errs towards fewer hits, never more); two answers to different questions rarely
reach it with the same numbers. Cost: two embeddings of up to 256 tokens each (a few ms of
the embedding thread's CPU), only for requests that had a candidate; none when the
embedder is busy (no outcome then).
"""

from __future__ import annotations

import re

import orjson

from gateway.embedding import Embed
from gateway.formats.answer import Answer

__all__ = ["AGREEMENT", "agree"]

#: Cosine similarity of the two answers' embeddings from which they agree.
AGREEMENT = 0.9
_PUNCT = re.compile(r"[\W_]+")
_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")


def _calls(answer: Answer) -> list[tuple[object, object]]:
    out: list[tuple[object, object]] = []
    for call in answer.tool_calls or []:
        fn = call.get("function") or {}
        try:
            args = orjson.loads(fn.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            args = fn.get("arguments")
        out.append((fn.get("name"), args))
    return out


async def agree(cached: Answer, fresh: Answer, embed: Embed | None) -> bool | None:
    """Whether ``fresh`` agrees with ``cached``; None when it cannot be told (no text, or
    the embedder failed)."""
    if cached.tool_calls or fresh.tool_calls:
        return _calls(cached) == _calls(fresh)
    a, b = cached.content, fresh.content
    if not a or not b:
        return None
    na, nb = _PUNCT.sub(" ", a.lower()).strip(), _PUNCT.sub(" ", b.lower()).strip()
    if na == nb:
        return True
    if set(_DIGITS.findall(a)) != set(_DIGITS.findall(b)):
        return False
    if embed is None:
        return None
    try:
        u, v = await embed([a, b])
    except Exception:  # noqa: BLE001 - no outcome, never an error
        return None
    return float(u @ v) >= AGREEMENT
