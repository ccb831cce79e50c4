"""A target's recent times to first token, and the first-token deadline learned from them.

Each streamed attempt on a target adds one sample: the time (ms) from the attempt's start to
its upstream's first text, tool-call or reasoning delta, with the request's size (bytes); an
attempt cut by the deadline adds the time it was given (a lower bound: a target slowing
for everyone raises its own deadline within a few cuts). The deadline is a high percentile
of the last ``SIZE`` samples times a factor, never under a floor, and scaled up for a
request larger than the window's median one (a long prompt's prefill is not cut by a
deadline learned from short ones).

Why a percentile times a factor: a deadline at or above the p-th percentile cuts at most
(1 - p) of a target's attempts whatever the shape of its tail, so duplicate billing (a cut
attempt's prompt is paid for, then sent again) is bounded by construction; the factor keeps
the tail itself (hosted APIs' TTFTs are heavy-tailed) and cuts only attempts far beyond it.
(PeakEWMA, :mod:`gateway.balance`, tracks a target's latency for choosing among replicas,
but as a peak-weighted mean, which cannot say what share of attempts a deadline cuts.)
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort

__all__ = ["TtftWindow"]


class TtftWindow:
    """The last ``SIZE`` (ttft_ms, request bytes) samples of one target, in a ring, each
    also kept sorted (a bisection and a move of at most 256 pointers a sample: re-sorting
    on demand cost ~10k instructions a request)."""

    SIZE = 256

    __slots__ = ("_bytes", "_ms", "_next", "_sorted_bytes", "_sorted_ms")

    def __init__(self) -> None:
        self._ms: list[float] = []
        self._bytes: list[int] = []
        self._next = 0
        self._sorted_ms: list[float] = []
        self._sorted_bytes: list[int] = []

    def __len__(self) -> int:
        return len(self._ms)

    def add(self, ms: float, size: int) -> None:
        """One attempt's time to first token (ms) and its request's size (bytes)."""
        if len(self._ms) < self.SIZE:
            self._ms.append(ms)
            self._bytes.append(size)
        else:
            at = self._next
            del self._sorted_ms[bisect_left(self._sorted_ms, self._ms[at])]
            del self._sorted_bytes[bisect_left(self._sorted_bytes, self._bytes[at])]
            self._ms[at], self._bytes[at] = ms, size
            self._next = (at + 1) % self.SIZE
        insort(self._sorted_ms, ms)
        insort(self._sorted_bytes, size)

    def deadline_ms(self, size: int, percentile: float, factor: float, floor_ms: float,
                    min_samples: int) -> float | None:
        """The learned deadline (ms) for a request of ``size`` bytes: ``factor`` times the
        ``percentile`` (0-1) of the samples, times the request's size over the median
        sample's when larger, at least ``floor_ms``; None while fewer than ``min_samples``
        samples (a cold target is not cut on no evidence)."""
        ms = self._sorted_ms
        n = len(ms)
        if n < min_samples or n == 0 or factor <= 0:
            return None
        at = ms[min(n - 1, max(0, math.ceil(percentile * n) - 1))]
        median = self._sorted_bytes[n // 2]
        scale = size / median if median and size > median else 1.0
        return max(floor_ms, factor * at * scale)
