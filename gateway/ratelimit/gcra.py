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
from typing import NamedTuple

__all__ = ["Bucket", "LocalGCRA", "Verdict", "decide", "settle"]

#: A new TAT this close (µs) past the tolerance still fits: float rounding, not a request.
SLACK_US = 0.5


class Bucket(NamedTuple):
    """``key`` names the bucket (in Redis too); ``limit`` units per ``period_s``; ``cost``:
    this request's units (negative when settling a refund). (A named tuple: a few are made
    for every request.)"""

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


class Verdict(NamedTuple):
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
    # One pass over the buckets (a request has two to four) for the decision, one for the
    # counts of the TATs kept.
    starts, news, waits = [], [], []
    allowed = True
    for tat, b in zip(tats, buckets, strict=True):
        tolerance = b.period_s * 1e6
        start = max(tat, now_us)
        new = start + b.cost * (tolerance / b.limit)
        wait = new - tolerance - now_us
        if not wait > 0.0:  # as max(0.0, wait)
            wait = 0.0
        elif wait > SLACK_US:
            allowed = False
        starts.append(start)
        news.append(new)
        waits.append(wait)
    kept = news if allowed else starts
    remaining, reset_s = _counts(kept, buckets, now_us)
    wait_s = (0.0,) * len(waits) if allowed else tuple([w / 1e6 for w in waits])
    return Verdict(allowed, tuple(remaining), tuple(reset_s), wait_s, store), kept


def _counts(tats: Sequence[float], buckets: Sequence[Bucket], now_us: float
            ) -> tuple[list[int], list[float]]:
    """Per bucket at ``tats``: the units left and the seconds until it is full."""
    remaining, reset_s = [], []
    for tat, b in zip(tats, buckets, strict=True):
        tolerance = b.period_s * 1e6
        left = math.floor((tolerance - (tat - now_us)) / (tolerance / b.limit) + 1e-9)
        remaining.append(max(0, left))
        reset_s.append((tat - now_us) / 1e6)
    return remaining, reset_s


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
        # The common case, every bucket admitting the request, in one pass: decide()'s
        # arithmetic on the same floats, its counts made from each new TAT as it comes;
        # the first bucket that refuses hands the request to decide() itself.
        keys, news, remaining, reset_s = [], [], [], []
        for b in buckets:
            tolerance = b.period_s * 1e6
            interval = tolerance / b.limit
            new = max(tats.get(b.key, now), now) + b.cost * interval
            if new - tolerance - now > SLACK_US:
                break
            keys.append(b.key)
            news.append(new)
            remaining.append(max(0, math.floor((tolerance - (new - now)) / interval + 1e-9)))
            reset_s.append((new - now) / 1e6)
        else:
            tats.update(zip(keys, news))
            self._sweep(now)
            return Verdict(True, tuple(remaining), tuple(reset_s), (0.0,) * len(news), store)
        verdict, kept = decide([tats.get(b.key, now) for b in buckets], buckets, now, store)
        if verdict.allowed:  # (never: the pass above found a bucket that refuses)
            tats.update(zip([b.key for b in buckets], kept))
            self._sweep(now)
        return verdict

    def charge(self, buckets: Sequence[Bucket], cap: bool) -> None:
        """Add each bucket's cost without a check (:func:`settle`'s arithmetic, inline)."""
        now = self.clock() * 1e6
        tats = self.tats
        for b in buckets:
            new = max(now, max(tats.get(b.key, now), now) + b.cost * (b.period_s * 1e6 / b.limit))
            tats[b.key] = min(new, now + b.period_s * 1e6) if cap else new
        self._sweep(now)

    def _sweep(self, now: float) -> None:
        if len(self.tats) < self._sweep_at:
            return
        self.tats = {k: tat for k, tat in self.tats.items() if tat > now}
        self._sweep_at = max(1024, 2 * len(self.tats))
