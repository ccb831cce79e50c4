"""``compress``: a long context cut to a token budget, question-aware, units kept whole or,
with the fine pass, thinned inside.

The coarse step of LongLLMLingua (Jiang et al., ACL 2024) with the gateway's own models:
split the context into units (:mod:`~gateway.compression.units`), score each against the
question (:mod:`~gateway.compression.rank`), keep the best that fit the budget and write
them with the most relevant at both ends (:mod:`~gateway.compression.select`). The question
is only read; pinned spans and JSON brackets stay where they were, byte for byte.

With a :data:`~gateway.compression.fine.Score` (``token_level``), coarse and fine share the
budget: the coarse step keeps units up to ``slack`` times the budget
(:class:`~gateway.compression.fine.FineOptions`), then the
fine pass (:mod:`~gateway.compression.fine`, LLMLingua's token-level step) drops the least
informative words inside the kept prose units until the text fits the same budget. Where it
cannot (too little prose: JSON records, code) or its scoring call fails, the result is the
coarse step's alone, at the budget, as without it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import structlog

from gateway.compression.fine import FINE, FineOptions, Score, fine
from gateway.compression.rank import WEIGHTS, Weights, relevance
from gateway.compression.select import budget, choose, ends_first
from gateway.compression.tokens import CountTokens
from gateway.compression.units import Layout, Unit, render, split, units_of
from gateway.embedding import Embed

__all__ = ["MAX_REGION_BYTES", "Result", "compress"]

log = structlog.get_logger("gateway.compression")

#: Kept units the fine pass may cut inside: prose. Code, JSON values and records stay whole.
_PROSE = frozenset({"document", "section", "item", "paragraph"})

#: A unit longer than this (UTF-8 bytes) stays whole: one text per scoring call, well
#: within the engine's limit per text (a byte-level tokenizer has at most a token a byte).
MAX_REGION_BYTES = 8192


@dataclass(frozen=True, slots=True)
class Result:
    """``text``: the compressed context; token counts by the ``count_tokens`` given;
    ``ms``: the whole call's wall time, embedding and scoring included. ``fine``: what the
    fine pass did (None when not asked): ``applied`` (it dropped words), ``unneeded`` (the
    coarse step's units fit the budget), ``no_room`` (too few words it may drop),
    ``error`` (the scoring call failed); but for ``applied`` and ``unneeded``, the text is
    the coarse step's alone."""

    text: str
    tokens_before: int
    tokens_after: int
    ms: float
    units_kept: int
    units_dropped: int
    fine: str | None = None

    @property
    def ratio(self) -> float:
        """Achieved compression, tokens before over after (1.0 when nothing changed)."""
        return self.tokens_before / self.tokens_after if self.tokens_after else 1.0


async def compress(context: str, question: str, target_ratio: float, embed: Embed | None,
                   count_tokens: CountTokens, reorder: bool = True, *,
                   pinned: Sequence[tuple[int, int]] = (),
                   weights: Weights = WEIGHTS, score: Score | None = None,
                   options: FineOptions = FINE) -> Result:
    """``context`` cut to at most ``floor(tokens_before / target_ratio)`` tokens, counted
    by ``count_tokens`` on the text returned, by dropping whole units; never all of them:
    when not even one fits beside the pinned text, the most relevant is kept over the
    budget. A context of one unit, or a ratio of at most 1, comes back as it was. Units are ranked against ``question`` (``embed``: one batched call;
    None ranks lexically only); ``reorder`` puts the most relevant documents or paragraphs
    at both ends, other runs (lists, code, JSON records) keep their order. ``pinned``:
    [start, end) character spans of ``context`` kept in place whatever they cost.
    ``score``: the fine pass's scoring call (None: coarse only), run with ``options``.
    Raises ValueError for a ratio that is not a positive number."""
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
    arrange = ends_first if reorder else None
    outcome = None
    if score is not None:
        loose = math.floor(max(0, limit - fixed) * max(1.0, options.slack))
        outcome, text, kept = await _fine(layout, costs, scores, loose, limit, count_tokens,
                                          arrange, score, options)
        if text is not None:
            return Result(text, tokens_before, count_tokens(text),
                          (time.perf_counter() - t0) * 1e3, kept, len(units) - kept, outcome)
    # Never every unit: when none fits, the most relevant stays, over the budget.
    chosen = choose(costs, scores, max(0, limit - fixed)) or [int(scores.argmax())]
    text = render(layout, chosen, arrange)
    tokens_after = count_tokens(text)
    while tokens_after > limit and len(chosen) > 1:
        # Units are costed one by one; written side by side, a join may tokenize apart.
        chosen.pop()
        text = render(layout, chosen, arrange)
        tokens_after = count_tokens(text)
    return Result(text, tokens_before, tokens_after, (time.perf_counter() - t0) * 1e3,
                  len(chosen), len(units) - len(chosen), outcome)


async def _fine(layout: Layout, costs: list[int], scores: np.ndarray, loose: int, limit: int,
                count_tokens: CountTokens, arrange: Callable[[list[int]], list[int]] | None,
                score: Score, options: FineOptions) -> tuple[str, str | None, int]:
    """Coarse at ``loose`` tokens for the droppable units, then the fine pass to ``limit``:
    (outcome, the text or None when the coarse step alone must do, units kept)."""
    kept = choose(costs, scores, max(0, loose)) or [int(scores.argmax())]
    where: list[tuple[Unit, int]] = []
    text = render(layout, kept, arrange, where)
    if count_tokens(text) <= limit:
        return "unneeded", text, len(kept)
    units = units_of(layout)
    whole = {id(units[i]) for i in kept[:options.whole]}  # kept is most relevant first
    regions = [(at + len(u.text) - len(u.content), at + len(u.text)) for u, at in where
               if u.kind in _PROSE and u.content and id(u) not in whole
               and len(u.text.encode()) <= MAX_REGION_BYTES]
    try:
        out = await fine(text, sorted(regions), limit, count_tokens, score,
                         options.keep_names)
    except Exception as exc:  # noqa: BLE001 - the fine pass is optional: coarse alone then
        log.warning("compression_fine_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        return "error", None, 0
    return ("no_room", None, 0) if out is None else ("applied", out, len(kept))
