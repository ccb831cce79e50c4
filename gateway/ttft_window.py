"""A target's recent times to first token, and the first-token deadline learned from them.

Each streamed attempt on a target adds one sample: the time (ms) from the attempt's start to
its upstream's first text, tool-call or reasoning delta, with the request's size (bytes); an
attempt cut by the deadline adds the time it was given (a lower bound: a target slowing
for everyone raises its own deadline within a few cuts). The deadline is a high percentile
of the first-token times of the ``NEIGHBOURS`` samples nearest the request in size (of the
last ``SIZE``) times a factor, never under a floor, and scaled up for a request larger than
all of those (a long prompt's prefill is not cut by a deadline learned from short ones).

Why the nearest in size: a target's traffic mixes kinds whose first tokens differ by
several times (a short chat turn, an agent's turn on a long cached prefix, a retrieval
prompt of 20 uncached documents); one percentile over all of them is the slow kind's, so
it would cut nothing of the fast kinds' tails. Requests of about the same size are mostly
of one kind, and their own percentile marks their own tail.

Why a percentile times a factor: a deadline at or above the p-th percentile cuts at most
(1 - p) of a target's attempts whatever the shape of its tail, so duplicate billing (a cut
attempt's prompt is paid for, then sent again) is bounded by construction; the factor keeps
the tail itself (hosted APIs' TTFTs are heavy-tailed) and cuts only attempts far beyond it.
(PeakEWMA, :mod:`gateway.balance`, tracks a target's latency for choosing among replicas,
but as a peak-weighted mean, which cannot say what share of attempts a deadline cuts.)
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort

__all__ = ["TtftWindow"]

_INF = float("inf")


class TtftWindow:
    """The last ``SIZE`` (ttft_ms, request bytes) samples of one target, in a ring, each
    also kept sorted by size (a bisection and a move of at most 256 pointers a sample)."""

    SIZE = 256
    #: Samples the percentile is taken over: those nearest the request in size.
    NEIGHBOURS = 64

    __slots__ = ("_by_size", "_next", "_ring")

    def __init__(self) -> None:
        self._ring: list[tuple[int, float]] = []
        self._next = 0
        self._by_size: list[tuple[int, float]] = []

    def __len__(self) -> int:
        return len(self._ring)

    def add(self, ms: float, size: int) -> None:
        """One attempt's time to first token (ms) and its request's size (bytes)."""
        sample = (size, ms)
        if len(self._ring) < self.SIZE:
            self._ring.append(sample)
        else:
            at = self._next
            del self._by_size[bisect_left(self._by_size, self._ring[at])]
            self._ring[at] = sample
            self._next = (at + 1) % self.SIZE
        insort(self._by_size, sample)

    def deadline_ms(self, size: int, percentile: float, factor: float, floor_ms: float,
                    min_samples: int) -> float | None:
        """The learned deadline (ms) for a request of ``size`` bytes: ``factor`` times the
        ``percentile`` (0-1) of the first-token times of the ``NEIGHBOURS`` samples nearest
        in size (and any of the same size as the farthest of them), times the request's size over the largest of theirs when larger, at least
        ``floor_ms``; None while fewer than ``min_samples`` samples (a cold target is not
        cut on no evidence)."""
        by_size = self._by_size
        n = len(by_size)
        if n < min_samples or n == 0 or factor <= 0:
            return None
        k = min(n, self.NEIGHBOURS)
        # centred on the samples of the request's own size (or where it would go)
        middle = (bisect_left(by_size, (size, -_INF)) + bisect_right(by_size, (size, _INF))) // 2
        lo = min(max(0, middle - k // 2), n - k)
        # ties at either end are all in (as near as those taken): no choice among them
        smallest, largest = by_size[lo][0], by_size[lo + k - 1][0]
        lo = bisect_left(by_size, (smallest, -_INF), 0, lo)
        hi = bisect_right(by_size, (largest, _INF), lo + k - 1)
        rank = max(0, math.ceil(percentile * (hi - lo)) - 1)
        if smallest == largest:  # one size: its times are in order already
            at = by_size[lo + rank][1]
        else:
            at = sorted([sample[1] for sample in by_size[lo:hi]])[rank]
        scale = size / largest if largest and size > largest else 1.0
        return max(floor_ms, factor * at * scale)
