"""GCRA, the generic cell rate algorithm, over several buckets at once; in process.

Source: the ATM Forum's GCRA as redis-cell implements it for Redis (Brandur Leach, "Rate
Limiting, Cells, and GCRA", https://brandur.org/rate-limiting). A bucket of ``limit`` units
per ``period`` keeps one number, its theoretical arrival time (TAT): each unit moves it
``interval = period / limit`` later; a request of ``cost`` units fits when the new TAT is at
most ``tolerance`` (one period: the whole limit may be spent at once, then it refills
continuously) ahead of now. It is exact at any rate with O(1) state and no timer, and a
limit changed by a policy reload applies at once (the state is a time, not a count).

A request is charged to all its buckets or to none (its requests and its tokens, per key
and per key and model): :func:`decide` checks every one first. The same arithmetic runs in
Redis as one Lua script (:mod:`gateway.ratelimit.redis_gcra`); :class:`LocalGCRA` is the
per-process store, used when no Redis is configured or while it is unreachable.
Times are microseconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Bucket", "LocalGCRA", "Verdict", "decide", "settle"]

#: A new TAT this close (µs) past the tolerance still fits: float rounding, not a request.
SLACK_US = 0.5


@dataclass(frozen=True, slots=True)
class Bucket:
    """``key`` names the bucket (in Redis too); ``limit`` units per ``period_s``; ``cost``:
    this request's units (negative when settling a refund)."""

    key: str
    limit: int
    cost: int
    period_s: float = 60.0

    @property
    def interval_us(self) -> float:
        return self.period_s * 1e6 / self.limit

    @property
    def tolerance_us(self) -> float:
        return self.period_s * 1e6


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision for one request, per bucket in the order asked: ``remaining`` units
    (after this request when allowed, before it when not), ``reset_s`` until the bucket is
    full again, ``wait_s`` until this request's cost fits (0: it fits now). ``store``:
    which limiter decided: ``redis``, ``local`` (no Redis configured) or ``fallback``
    (Redis configured but down or slow)."""

    allowed: bool
    remaining: tuple[int, ...]
    reset_s: tuple[float, ...]
    wait_s: tuple[float, ...]
    store: str = "local"

    @property
    def retry_after_s(self) -> float:
        """How long until the request fits in every bucket (s)."""
        return max(self.wait_s, default=0.0)


def decide(tats: Sequence[float], buckets: Sequence[Bucket], now_us: float,
           store: str = "local") -> tuple[Verdict, list[float]]:
    """One all-or-nothing GCRA decision. ``tats``: each bucket's TAT (µs; at or before
    ``now_us`` for a full bucket). Returns the verdict and the TATs to store (unchanged
    when refused)."""
    starts = [max(tat, now_us) for tat in tats]
    news = [start + b.cost * b.interval_us for start, b in zip(starts, buckets, strict=True)]
    waits = [max(0.0, new - b.tolerance_us - now_us)
             for new, b in zip(news, buckets, strict=True)]
    allowed = all(w <= SLACK_US for w in waits)
    kept = news if allowed else starts
    remaining = tuple(max(0, math.floor((b.tolerance_us - (tat - now_us)) / b.interval_us
                                        + 1e-9))
                      for tat, b in zip(kept, buckets, strict=True))
    verdict = Verdict(allowed, remaining,
                      tuple((tat - now_us) / 1e6 for tat in kept),
                      tuple(0.0 if allowed else w / 1e6 for w in waits), store)
    return verdict, kept


def settle(tat: float, bucket: Bucket, now_us: float, cap: bool) -> float:
    """Add ``bucket.cost`` (may be negative) without a check. ``cap``: never more than one
    full period ahead (a shadow charge of what Redis admitted); else a debt is kept (actual
    usage beyond what was reserved: later requests wait for it)."""
    new = max(now_us, max(tat, now_us) + bucket.cost * bucket.interval_us)
    return min(new, now_us + bucket.tolerance_us) if cap else new


class LocalGCRA:
    """Buckets in this process (``clock``: seconds, monotonic). All calls on the event-loop
    thread. Full buckets are forgotten (their TAT is in the past), swept as the table grows."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.tats: dict[str, float] = {}
        self._sweep_at = 1024

    def decide(self, buckets: Sequence[Bucket], store: str = "local") -> Verdict:
        now = self.clock() * 1e6
        tats = self.tats
        verdict, kept = decide([tats.get(b.key, now) for b in buckets], buckets, now, store)
        if verdict.allowed:
            for b, tat in zip(buckets, kept, strict=True):
                tats[b.key] = tat
            self._sweep(now)
        return verdict

    def charge(self, buckets: Sequence[Bucket], cap: bool) -> None:
        """Add each bucket's cost without a check (see :func:`settle`)."""
        now = self.clock() * 1e6
        tats = self.tats
        for b in buckets:
            tats[b.key] = settle(tats.get(b.key, now), b, now, cap)
        self._sweep(now)

    def _sweep(self, now: float) -> None:
        if len(self.tats) < self._sweep_at:
            return
        self.tats = {k: tat for k, tat in self.tats.items() if tat > now}
        self._sweep_at = max(1024, 2 * len(self.tats))
