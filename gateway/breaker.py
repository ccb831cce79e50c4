"""A circuit breaker per upstream: stop sending to an upstream that is failing, probe it, and
come back when it answers.

closed -> open when, within the last ``window_s``, at least ``min_requests`` outcomes were seen
and the failed share (5xx, 429, timeouts, connection errors, streams the upstream broke
midway) reached ``failure_rate``, or ``consecutive_failures`` failed in a row (a 429 burst,
a dead host). Open lasts ``open_ms``, or the upstream's Retry-After if longer. Then
half-open: up to ``half_open_probes`` requests go through; one success closes the breaker,
one failure opens it again.
(Nygard, "Release It!", ch. 5; the states as in resilience4j.)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from gateway.schema import bounded

__all__ = ["Breaker", "BreakerPolicy", "State"]


@dataclass(frozen=True)
class BreakerPolicy:
    enabled: bool = True
    window_s: float = bounded(10.0, ge=0.1)
    min_requests: int = bounded(20, ge=1)
    failure_rate: float = bounded(0.5, ge=0.01, le=1.0)
    consecutive_failures: int = bounded(5, ge=1)
    open_ms: float = bounded(5_000.0, ge=1)
    #: Retry-After values above this (ms) are capped: the breaker probes again by then.
    max_open_ms: float = bounded(60_000.0, ge=1)
    half_open_probes: int = bounded(1, ge=1)


class State(IntEnum):
    """Exported as the metric value: 0 closed, 1 half-open, 2 open."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


# The members as plain names: on Python 3.11 ``State.OPEN`` goes through EnumType's
# __getattr__ hook (~1k instructions an access), and the breaker is asked on every request.
_CLOSED, _HALF_OPEN, _OPEN = State.CLOSED, State.HALF_OPEN, State.OPEN


class Breaker:
    def __init__(self, policy: BreakerPolicy, clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self._clock = clock
        self._state = _CLOSED
        self._outcomes: deque[tuple[float, bool]] = deque()
        self._failures_in_window = 0
        self._consecutive = 0
        self._open_until = 0.0
        self._probes = 0
        self._probe_at = 0.0
        self.opened = 0  # times it opened, for tests and logs

    @property
    def state(self) -> State:
        if self._state is _OPEN and self._clock() >= self._open_until:
            self._state, self._probes = _HALF_OPEN, 0
        return self._state

    def retry_after_s(self) -> float:
        """Seconds until the breaker lets a probe through (0 unless open)."""
        return max(0.0, self._open_until - self._clock()) if self.state is _OPEN else 0.0

    def allow(self) -> bool:
        """May a request go to this upstream now? Half-open admits ``half_open_probes``."""
        if not self.policy.enabled:
            return True
        state = self.state
        if state is _CLOSED:
            return True
        if state is _HALF_OPEN:
            now = self._clock()
            if self._probes and now - self._probe_at > self.policy.open_ms / 1000:
                self._probes = 0  # the probes never reported back (cancelled): probe again
            if self._probes < self.policy.half_open_probes:
                self._probes += 1
                self._probe_at = now
                return True
        return False

    def record(self, ok: bool, retry_after_ms: float | None = None) -> None:
        """One outcome of a request that ``allow()`` let through."""
        if not self.policy.enabled:
            return
        now = self._clock()
        state = self.state
        if state is _HALF_OPEN:
            if ok:
                self._close()
            else:
                self._open(now, retry_after_ms)
            return
        if state is _OPEN:
            return  # a straggler from before the breaker opened
        self._outcomes.append((now, ok))
        if not ok:
            self._failures_in_window += 1
        self._consecutive = 0 if ok else self._consecutive + 1
        horizon = now - self.policy.window_s
        while self._outcomes and self._outcomes[0][0] < horizon:
            _, old_ok = self._outcomes.popleft()
            if not old_ok:
                self._failures_in_window -= 1
        total = len(self._outcomes)
        if self._consecutive >= self.policy.consecutive_failures or (
            total >= self.policy.min_requests
            and self._failures_in_window >= self.policy.failure_rate * total
        ):
            self._open(now, retry_after_ms)

    def _open(self, now: float, retry_after_ms: float | None) -> None:
        hold = max(self.policy.open_ms, retry_after_ms or 0.0)
        self._open_until = now + min(hold, self.policy.max_open_ms) / 1000
        self._state = _OPEN
        self.opened += 1

    def _close(self) -> None:
        self._state = _CLOSED
        self._outcomes.clear()
        self._failures_in_window = 0
        self._consecutive = 0
