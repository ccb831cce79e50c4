"""An upstream's guard: its admission limiter, circuit breaker and latency estimate, kept
across policy reloads (dispatch checks each before trying the upstream)."""

from __future__ import annotations

from gateway.balance import PeakEwma
from gateway.breaker import Breaker
from gateway.concurrency import Limiter
from gateway.policy import Policy
from gateway.service_time import ServiceRates

__all__ = ["Guard"]


class Guard:
    """An upstream's admission limiter and circuit breaker, updated in place on reload."""

    def __init__(self, policy: Policy, capacity: int | None = None):
        self.capacity = capacity
        #: The upstream's measured rates (gateway.service_time), when it reports them.
        self.rates: ServiceRates | None = None
        self.admission = policy.admission
        self.limiter = Limiter(policy.admission.for_capacity(capacity))
        self.breaker = Breaker(policy.breaker)
        #: Its latency estimate and requests in flight, for the balanced models' choice.
        self.ewma = PeakEwma()

    def update(self, policy: Policy) -> None:
        self.admission = policy.admission
        self._limit()
        self.breaker.policy = policy.breaker

    def set_capacity(self, capacity: int | None, rates: ServiceRates | None = None) -> None:
        """The upstream's capacity and measured rates changed (the local engine reports them
        once up): admission follows (gateway.concurrency.AdmissionPolicy.for_capacity)."""
        self.capacity, self.rates = capacity, rates
        self._limit()

    def _limit(self) -> None:
        # The limiter predicts service times only where the policy lets requests wait on
        # them (queue_slowdown): otherwise no request pays for the bookkeeping.
        self.limiter.rates = self.rates if self.admission.queue_slowdown else None
        old = self.limiter.policy
        new = self.admission.for_capacity(self.capacity, self.limiter.rates)
        self.limiter.policy = new
        if (old.limiter, old.max_concurrency) != (new.limiter, new.max_concurrency):
            self.limiter.limit = float(new.max_concurrency)
