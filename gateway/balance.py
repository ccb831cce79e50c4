"""Latency-aware choice among a model's equivalent targets: PeakEWMA with the power of two
choices, as Finagle and Linkerd balance (Finagle's ``Balancers.p2cPeakEwma``).

By default a model's targets are an ordered fallback list: the first is tried, then the
next. A model the policy names in ``[balance] models`` has targets that are replicas of one
another (deployments of the same model); each request then goes first to the better of two
targets drawn at random, the rest following in their order as fallbacks. A target's cost
is its latency estimate times its requests in flight plus one. The estimate is an EWMA of
its time to first byte (the whole answer for unary requests) that jumps to any slower
sample at once (the "peak") and decays towards faster ones with time constant ``decay_s``;
a failed attempt counts as a sample of ``failure_penalty_ms``. A target never sampled costs
nothing, so it is tried soon.

**Hedging** (Dean & Barroso, "The Tail at Scale", CACM 2013): a model listed in
``hedge_after_ms`` whose call has no first byte (a stream's first event, a whole answer)
after that long is also sent to its next target; whichever answers first is served, the
other cancelled at once (its connection dropped, so the upstream stops). A budget bounds
the hedges to ``hedge_budget`` per request on average, and none are sent while most recent
requests are late (:class:`gateway.hedge.HedgeBudget`: under overload every request is
slow, and hedging would only double the load; ``bench/tail.py``: at most 2% extra calls at
3x overload). A hedge is sent only when the next target has a free admission slot now (it
never queues), so an overloaded upstream is not sent twice the load.

::

    [balance]
    models = { "llama-70b" = "peak_ewma" }
    decay_s = 10.0
    failure_penalty_ms = 5000.0
    hedge_after_ms = { "llama-70b" = 800 }
    hedge_budget = 0.05

**Affinity** (``models = { "gpt-4o" = "affinity" }``, :mod:`gateway.affinity`): the targets
are deployments of one hosted model, each with its own prompt cache; a conversation stays
on the one that took it for ``affinity_ttl_s`` after its last request, unless it fails.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from gateway.affinity import Affinity
from gateway.config import Target
from gateway.schema import bounded

__all__ = ["BalancePolicy", "PeakEwma", "arrange", "choose"]

T = TypeVar("T")
B = TypeVar("B")


@dataclass(frozen=True)
class BalancePolicy:
    #: Public model -> how to choose among its targets ("ordered": the fallback list;
    #: "affinity": a conversation stays on its target while its prompt cache is warm,
    #: gateway.affinity).
    models: dict[str, Literal["ordered", "peak_ewma", "affinity"]] = field(default_factory=dict)
    decay_s: float = bounded(10.0, ge=0.001)
    failure_penalty_ms: float = bounded(5000.0, ge=0.0)
    #: Public model -> ms without a first byte after which the request is also sent to the
    #: model's next target (its targets then being equivalent); the first answer is served
    #: and the other call cancelled.
    hedge_after_ms: dict[str, float] = field(default_factory=dict)
    #: Hedges allowed per request, on average (a token bucket, as the retry budget; none while
    #: most requests are late), so hedging never multiplies an overloaded upstream's load.
    hedge_budget: float = bounded(0.05, ge=0.0, le=1.0)
    #: "affinity" models: how long a conversation stays with its target after its last
    #: request (s): the provider's prompt-cache lifetime (OpenAI 5-10 min idle, Anthropic 5
    #: min by default; OpenRouter keeps a conversation on one provider for 10 min).
    affinity_ttl_s: float = bounded(300.0, ge=0.0)


class PeakEwma:
    """One target's latency estimate (ms) and requests in flight."""

    __slots__ = ("_at", "clock", "estimate_ms", "pending")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.estimate_ms = 0.0
        self.pending = 0
        self.clock = clock
        self._at = clock()

    def observe(self, latency_ms: float, decay_s: float) -> None:
        now = self.clock()
        if latency_ms > self.estimate_ms:
            self.estimate_ms = latency_ms  # a slower sample counts at once
        else:
            w = math.exp(-(now - self._at) / decay_s)
            self.estimate_ms = self.estimate_ms * w + latency_ms * (1 - w)
        self._at = now

    def cost(self, decay_s: float) -> float:
        """The estimate decayed to now (towards 0 while nothing is sampled), times the
        requests in flight plus one."""
        w = math.exp(-(self.clock() - self._at) / decay_s)
        return self.estimate_ms * w * (self.pending + 1)


def choose(targets: Sequence[T], cost: Callable[[T], float],
           rand: Callable[[int, int], int] = random.randint) -> list[T]:
    """``targets`` with the cheaper of two drawn at random first, the rest in their order."""
    n = len(targets)
    if n < 2:
        return list(targets)
    i = rand(0, n - 1)
    j = rand(0, n - 2)
    if j >= i:
        j += 1
    best = i if cost(targets[i]) <= cost(targets[j]) else j
    return [targets[best], *targets[:best], *targets[best + 1:]]


class _Guarded(Protocol):
    ewma: PeakEwma


def arrange(policy: BalancePolicy, model: str, targets: Sequence[Target],
            guards: Mapping[str, _Guarded], affinity: Affinity, body: dict[str, Any],
            build: Callable[[Target], B]) -> tuple[Sequence[Target], Callable[[Target], B]]:
    """``model``'s ``targets`` in the order ``policy.models`` asks for it (as they are when
    it names none), and ``build`` (the request for a target), wrapped for "affinity" to
    record each target a conversation is sent to."""
    mode = policy.models.get(model)
    if mode == "peak_ewma":
        decay = policy.decay_s
        return choose(targets, lambda t: guards[t.upstream].ewma.cost(decay)), build
    if mode == "affinity":
        return affinity.route(model, targets, body, policy.affinity_ttl_s, build)
    return targets, build
