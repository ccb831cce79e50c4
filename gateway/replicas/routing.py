"""Which replica of a pool gets a request: ``round_robin``, ``least_load``, ``prefix``
(approximate) and ``prefix_precise``.

Each policy orders a pool's replicas for one request, the chosen one first and the rest as
the failover order (least loaded first). The two prefix policies are SGLang's router's
``cache_aware`` policy (sgl-router, ``policies/cache_aware``): while the pool is balanced,
the request goes to the replica holding the longest prefix of its prompt when that covers
more than ``cache_threshold`` of it, else to the least loaded replica (ties: the one
holding fewest blocks, i.e. the most room); when the pool is imbalanced (the most and least
loaded replicas differ by more than ``balance_abs_threshold`` requests *and* by a factor
over ``balance_rel_threshold``) the least loaded replica gets it, so a hot prefix does not
pile onto one replica. They differ in what "holding" means
(:mod:`gateway.replicas.prefix`): ``prefix`` counts the byte blocks this gateway sent each
replica, evicted LRU at the replica's KV capacity (an estimate, per gateway process);
``prefix_precise`` counts the engine's own token blocks, as the engine reports them (its KV
events, as vLLM publishes them and llm-d's precise prefix-cache scorer reads them), plus
the blocks of requests sent in the last ``pending_s`` that no report can show yet
(NVIDIA Dynamo's KV router keeps such predicted blocks too).

Everything here is synchronous and clock-injected: ``bench/replicas.py`` runs these very
classes on a simulated clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

from gateway.replicas.prefix import PrefixIndex

__all__ = ["CacheAware", "LeastLoad", "Replica", "RoundRobin", "Router", "RoutingName",
           "make_router"]

RoutingName = Literal["round_robin", "least_load", "prefix", "prefix_precise"]


class Replica:
    """One replica as the policies see it: ``in_flight``, the requests this gateway has on it
    now; ``reported``, the running and waiting sequences it last reported (its /healthz; 0
    when it reports none, so several gateways see each other's load); ``sent``, the
    approximate index of what this gateway sent it (capacity in blocks); ``held``, the
    blocks it reports holding (precise); ``pending``, keys sent but not reported yet (key
    -> when they stop counting, s)."""

    __slots__ = ("_pending_order", "held", "in_flight", "name", "pending", "reported", "sent",
                 "weight")

    def __init__(self, name: str, capacity_blocks: int | None = None) -> None:
        self.name = name
        self.in_flight = 0
        self.reported = 0
        self.sent = PrefixIndex(capacity_blocks)
        self.held = PrefixIndex()
        self.pending: dict[int, float] = {}
        self._pending_order: deque[tuple[float, int]] = deque()
        #: 0..1: a replica back from ejection takes load gradually (gateway.replicas.health).
        self.weight = 1.0

    @property
    def load(self) -> int:
        """Requests on it: the larger of this gateway's count and its own report."""
        return max(self.in_flight, self.reported)

    @property
    def cost(self) -> float:
        """Its load, inflated while it ramps back after an ejection (``weight`` < 1), so it
        comes last among equals and takes a growing share."""
        load = max(self.in_flight, self.reported)
        return load if self.weight >= 1.0 else (load + 1) / max(self.weight, 0.05)

    def expect(self, keys: Sequence[int], until: float) -> None:
        """``keys`` were just sent: they count as held until ``until`` (s) or a report."""
        for key in keys:
            self.pending[key] = until
            self._pending_order.append((until, key))

    def expire(self, now: float) -> None:
        order, pending = self._pending_order, self.pending
        while order and order[0][0] <= now:
            _, key = order.popleft()
            if pending.get(key, now + 1) <= now:
                del pending[key]

    def precise_match(self, keys: Sequence[int]) -> int:
        held, pending = self.held, self.pending
        n = 0
        for key in keys:
            if key not in held and key not in pending:
                break
            n += 1
        return n


class Router:
    """A routing policy: ``order(replicas, keys)`` -> the replicas to try, best first
    (``replicas`` non-empty, the healthy ones; ``keys``: the request's block keys, empty for
    the policies that need none)."""

    #: Which keys the policy wants: None, "bytes" (approximate) or "tokens" (precise).
    keys: str | None = None

    #: Why the last order put its first replica first (traces: gateway.tracing).
    why = ""

    def order(self, replicas: Sequence[Replica], keys: Sequence[int]) -> list[Replica]:
        raise NotImplementedError


class RoundRobin(Router):
    why = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def order(self, replicas: Sequence[Replica], keys: Sequence[int]) -> list[Replica]:
        i = self._next % len(replicas)
        self._next = i + 1
        return [*replicas[i:], *replicas[:i]]


def _by_load(replicas: Sequence[Replica], start: int) -> list[Replica]:
    """Least loaded first (by :attr:`Replica.cost`); ties in a rotating order from
    ``start``, so equal replicas share the requests instead of the first taking them all."""
    n = len(replicas)
    return [replicas[i] for i in sorted(range(n), key=lambda i: (replicas[i].cost,
                                                                 (i - start) % n))]


class LeastLoad(Router):
    """The replica with the fewest requests on it (running and queued)."""

    why = "least_load"

    def __init__(self) -> None:
        self._turn = 0

    def order(self, replicas: Sequence[Replica], keys: Sequence[int]) -> list[Replica]:
        self._turn += 1
        return _by_load(replicas, self._turn)


class CacheAware(Router):
    """SGLang's cache-aware policy over the approximate (``precise=False``) or reported
    (``precise=True``) index; see the module docstring. ``clock``: seconds."""

    def __init__(self, precise: bool, cache_threshold: float = 0.5,
                 balance_abs_threshold: float = 4, balance_rel_threshold: float = 1.5,
                 pending_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.precise = precise
        self.keys = "tokens" if precise else "bytes"
        self.cache_threshold = cache_threshold
        self.abs_threshold = balance_abs_threshold
        self.rel_threshold = balance_rel_threshold
        self.pending_s = pending_s
        self.clock = clock
        self._turn = 0

    def order(self, replicas: Sequence[Replica], keys: Sequence[int]) -> list[Replica]:
        self._turn += 1
        ranked = _by_load(replicas, self._turn)
        loads = [r.load for r in ranked]  # a ramping replica's raw load: no imbalance
        least, most = min(loads), max(loads)
        chosen = ranked[0]
        balanced = not (most - least > self.abs_threshold
                        and most > self.rel_threshold * least)
        self.why = "least_load" if balanced else "imbalance"
        if balanced and keys:
            if self.precise:
                now = self.clock()
                for r in ranked:
                    r.expire(now)
                matches = [r.precise_match(keys) for r in ranked]
            else:
                matches = [r.sent.match(keys) for r in ranked]
            best = max(range(len(ranked)), key=lambda i: (matches[i], -i))
            if matches[best] > self.cache_threshold * len(keys):
                chosen, self.why = ranked[best], "prefix_match"
            else:  # nobody holds much of it: the least loaded, with the most room
                low = [r for r in ranked if r.cost == ranked[0].cost]
                chosen = min(low, key=lambda r: len(r.held if self.precise else r.sent))
        if keys:
            if self.precise:
                chosen.expect(keys, self.clock() + self.pending_s)
            else:
                chosen.sent.add(keys)
        return [chosen, *(r for r in ranked if r is not chosen)]


def make_router(name: RoutingName, cache_threshold: float = 0.5,
                balance_abs_threshold: float = 4, balance_rel_threshold: float = 1.5,
                pending_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> Router:
    """The policy ``name`` (thresholds: see :class:`CacheAware`)."""
    if name == "round_robin":
        return RoundRobin()
    if name == "least_load":
        return LeastLoad()
    return CacheAware(name == "prefix_precise", cache_threshold, balance_abs_threshold,
                      balance_rel_threshold, pending_s, clock)
