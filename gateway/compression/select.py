"""Which units fit the budget, and in what order they are written.

Coarse selection as LongLLMLingua's document-level step (Jiang et al., ACL 2024): the most
relevant units first, each kept whole or dropped whole, until the token budget is spent; a
unit too big for what is left is skipped and smaller, less relevant ones may still fit.
Then the kept units are ordered so that the most relevant sit at the start and the end of
the context, where language models use information best (Liu et al., "Lost in the Middle",
TACL 2024); LongLLMLingua's document reordering does the same for the start. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["budget", "choose", "ends_first"]


def budget(tokens: int, target_ratio: float, fixed: int = 0) -> int:
    """Tokens the droppable units may use: ``floor(tokens / target_ratio) - fixed`` (at
    least 0), where ``fixed`` is what the text that never changes costs. Raises ValueError
    for a ratio that is not a positive finite number."""
    if not (math.isfinite(target_ratio) and target_ratio > 0):
        raise ValueError(f"target_ratio must be a positive number, got {target_ratio!r}")
    return max(0, math.floor(tokens / target_ratio) - fixed)


def choose(costs: Sequence[int], scores: np.ndarray, limit: int) -> list[int]:
    """Indices of the units kept, most relevant first: greedily by score (ties: the earlier
    unit), each taken if its cost (tokens) still fits within ``limit`` tokens."""
    kept: list[int] = []
    spent = 0
    for i in sorted(range(len(costs)), key=lambda i: (-scores[i], i)):
        if spent + costs[i] <= limit:
            kept.append(i)
            spent += costs[i]
    return kept


def ends_first(ranked: Sequence[int]) -> list[int]:
    """``ranked`` (most relevant first) laid out best at both ends, least in the middle:
    ranks 1, 3, 5, ... from the start and 2, 4, 6, ... from the end ([a, b, c, d, e] ->
    [a, c, e, d, b])."""
    return [*ranked[0::2], *reversed(ranked[1::2])]
