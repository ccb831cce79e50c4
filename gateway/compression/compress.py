"""``compress``: a long context cut to a token budget, question-aware, units kept whole.

The coarse step of LongLLMLingua (Jiang et al., ACL 2024) with the gateway's own models:
split the context into units (:mod:`~gateway.compression.units`), score each against the
question (:mod:`~gateway.compression.rank`), keep the best that fit the budget and write
them with the most relevant at both ends (:mod:`~gateway.compression.select`). The question
is only read; pinned spans and JSON brackets stay where they were, byte for byte.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.compression.rank import WEIGHTS, Weights, relevance
from gateway.compression.select import budget, choose, ends_first
from gateway.compression.tokens import CountTokens
from gateway.compression.units import render, split, units_of
from gateway.embedding import Embed

__all__ = ["Result", "compress"]


@dataclass(frozen=True, slots=True)
class Result:
    """``text``: the compressed context; token counts by the ``count_tokens`` given;
    ``ms``: the whole call's wall time, embedding included."""

    text: str
    tokens_before: int
    tokens_after: int
    ms: float
    units_kept: int
    units_dropped: int

    @property
    def ratio(self) -> float:
        """Achieved compression, tokens before over after (1.0 when nothing changed)."""
        return self.tokens_before / self.tokens_after if self.tokens_after else 1.0


async def compress(context: str, question: str, target_ratio: float, embed: Embed | None,
                   count_tokens: CountTokens, reorder: bool = True, *,
                   pinned: Sequence[tuple[int, int]] = (),
                   weights: Weights = WEIGHTS) -> Result:
    """``context`` cut to at most ``floor(tokens_before / target_ratio)`` tokens, counted
    by ``count_tokens`` on the text returned, by dropping whole units; never all of them:
    when not even one fits beside the pinned text, the most relevant is kept over the
    budget. A context of one unit, or a ratio of at most 1, comes back as it was. Units are ranked against ``question`` (``embed``: one batched call;
    None ranks lexically only); ``reorder`` puts the most relevant documents or paragraphs
    at both ends, other runs (lists, code, JSON records) keep their order. ``pinned``:
    [start, end) character spans of ``context`` kept in place whatever they cost. Raises
    ValueError for a ratio that is not a positive number."""
    t0 = time.perf_counter()
    tokens_before = count_tokens(context)
    limit = budget(tokens_before, target_ratio)
    layout = split(context, pinned)
    units = units_of(layout)
    if limit >= tokens_before or len(units) < 2:
        return Result(context, tokens_before, tokens_before,
                      (time.perf_counter() - t0) * 1e3, len(units), 0)
    fixed = sum(count_tokens(part) for part in layout if isinstance(part, str))
    costs = [count_tokens(u.text + u.gap) for u in units]
    scores = await relevance([u.content for u in units], question, embed, weights)
    # Never every unit: when none fits, the most relevant stays, over the budget.
    kept = choose(costs, scores, max(0, limit - fixed)) or [int(scores.argmax())]
    text = render(layout, kept, ends_first if reorder else None)
    tokens_after = count_tokens(text)
    while tokens_after > limit and len(kept) > 1:
        # Units are costed one by one; written side by side, a join may tokenize apart.
        kept.pop()
        text = render(layout, kept, ends_first if reorder else None)
        tokens_after = count_tokens(text)
    return Result(text, tokens_before, tokens_after, (time.perf_counter() - t0) * 1e3,
                  len(kept), len(units) - len(kept))

