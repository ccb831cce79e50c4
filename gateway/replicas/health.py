"""Outlier detection for a pool's replicas, as Envoy's: consecutive errors eject a replica
for a time that grows with each ejection; back, it ramps up (Envoy's slow start).

Envoy docs: "Outlier detection" (consecutive_5xx, base_ejection_time x the number of times
ejected, max_ejection_time, max_ejection_percent) and "Slow start mode".
"""

from __future__ import annotations

from gateway.replicas.config import OutlierConfig

__all__ = ["Outlier"]


class Outlier:
    """One replica's errors and ejection; ``now`` arguments are monotonic seconds."""

    __slots__ = ("_back_at", "_healthy_since", "consecutive", "ejected_total", "ejected_until",
                 "ejections", "policy")

    def __init__(self, policy: OutlierConfig) -> None:
        self.policy = policy
        self.consecutive = 0
        self.ejections = 0  # this run of ejections (the ejection time's factor)
        self.ejected_total = 0
        self.ejected_until: float | None = None
        self._back_at: float | None = None
        self._healthy_since = 0.0

    def available(self, now: float) -> bool:
        until = self.ejected_until
        if until is None:
            return True
        if now < until:
            return False
        self.ejected_until, self._back_at, self.consecutive = None, now, 0
        return True

    def weight(self, now: float) -> float:
        """The share of its load a replica back from ejection takes: 0.1 rising to 1 over
        ``ramp_s``."""
        back, ramp = self._back_at, self.policy.ramp_s
        if back is None or ramp <= 0 or now - back >= ramp:
            self._back_at = None
            return 1.0
        return 0.1 + 0.9 * (now - back) / ramp

    def failed(self, now: float, may_eject: bool) -> bool:
        """An error; returns True when it ejects the replica (``may_eject``: the pool's
        max_ejection_percent allows one more)."""
        self.consecutive += 1
        if self.ejected_until is not None or self.consecutive < self.policy.consecutive_errors:
            return False
        if not may_eject:
            return False
        if now - self._healthy_since > self.policy.max_ejection_s:
            self.ejections = 0  # healthy long enough: the ejection time starts over
        self.ejections += 1
        self.ejected_total += 1
        p = self.policy
        self.ejected_until = now + min(p.base_ejection_s * self.ejections, p.max_ejection_s)
        self._healthy_since = self.ejected_until
        return True

    def succeeded(self) -> None:
        self.consecutive = 0
