"""Admission control per upstream: a concurrency limit, a bounded priority queue, a lane for
long prompts, and an adaptive limit.

A request takes a *slot* before it is sent upstream and gives it back when its response is
complete (for a stream: when the stream ends). When every slot is taken it waits in a queue
ordered by priority, then, within a priority, fairly between tenants (gateway keys): start-time
fair queueing (Goyal et al., SIGCOMM 1996) with one unit per request, so a key with a backlog
of a hundred requests takes turns with a key that has one, instead of holding the queue for
its hundred; arrival order within a key. It is shed at once when the wait it can expect (Little's
law: position / limit x mean service time) exceeds half of ``max_queue_wait_ms`` (room for
variance), and after ``max_queue_wait_ms`` otherwise, so a shed answer comes fast instead of
after a timeout.
Requests whose body is over ``long_prompt_bytes`` may hold at most ``long_lane_share`` of the
slots, so long prompts cannot starve short ones; ``low`` priority requests (batch) at most
``low_priority_share``, so the rest stays free for interactive requests as they arrive, which
then wait for no batch request to end (a reserve, as Kubernetes' API Priority and Fairness
gives each priority level its own share of the seats). Where several gateway keys share the
slots (two keys or more configured), one key holds at most ``per_key_share`` of them: a key
whose clients never let their streams end (or never read them) cannot pin every slot and
get the others shed; its requests past its share wait for one of its own to end.

On top of the upstreams' limiters (:mod:`gateway.entry_limits`): requests in flight per
gateway key and gateway-wide, checked on arrival, and a public model's own
``model_max_concurrency``. All state lives on the event-loop thread.

An upstream that knows its capacity (the local engine: the batch it measured worth running at
once, local_engine.calibrate; more only wait inside it, out of the gateway's reach) is
admitted to match it by
default (:meth:`AdmissionPolicy.for_capacity`): an adaptive limit capped at its capacity.
Beyond it, a request waits only while its predicted response time (the wait for a seat,
then its service at the pace slots are held now) stays within ``1 + queue_slowdown`` times
its service time at the engine's measured rates (:mod:`gateway.service_time`): a few long
conversations just past the seats wait a turn, while a flood, whose batch already slows every
answer, is shed at once, labelled (``queue_full``), instead of waiting past client timeouts.
Without measured rates, nothing waits.

The limit is static, or adaptive by AIMD as in Netflix's concurrency-limits (AIMDLimit):
+1 per sample while the limit is in use, x ``backoff`` on an error, a timeout, or latency
over ``latency_target_ms`` (the sample is the TTFT for streams, the whole response otherwise).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import time

from gateway.admission_policy import PRIORITY_RANK, AdmissionPolicy, Priority
from gateway.errors import Overloaded
from gateway.service_time import ServiceRates, Work, predicted_wait_ms

__all__ = ["PRIORITY_RANK", "AdmissionPolicy", "Limiter", "Priority", "Shed", "Slot"]

#: A waiter: (priority rank, virtual start, arrival, its future, long prompt, tenant).
_Entry = tuple[int, float, int, "asyncio.Future[None]", bool, "str | None"]


class Shed(Exception):
    """A request could not be admitted; ``reason`` names why (for logs, headers, metrics)."""

    def __init__(self, reason: str, retry_after_s: float = 1.0):
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s

    def overloaded(self, min_retry_after_s: float = 0.0) -> Overloaded:
        """The 503 a client gets for it: labelled with the reason, ``Retry-After`` at least
        ``min_retry_after_s``, and ``retry-after-ms`` drawn from [1, 2) times that: shed
        clients that all waited the same second would come back as one burst (jitter as in
        AWS's "Exponential Backoff and Jitter", 2015)."""
        after_s = max(min_retry_after_s, self.retry_after_s)
        whole_ms = math.ceil(after_s) * 1000  # what Retry-After says, in ms
        return Overloaded(f"the gateway is overloaded ({self.reason}); retry later",
                          reason=self.reason, retry_after_s=after_s,
                          retry_after_ms=whole_ms * (1 + random.random()))


class Slot:
    """One admitted request's hold on its upstream; ``release`` exactly once."""

    __slots__ = ("_limiter", "_long", "_low", "_tenant", "predicted_ms", "released", "started",
                 "waited_ms")

    def __init__(self, limiter: Limiter, long: bool, waited_ms: float,
                 predicted_ms: float | None = None, low: bool = False,
                 tenant: str | None = None):
        self._limiter = limiter
        self._long = long
        self._low = low
        self._tenant = tenant
        self.started = time.perf_counter()
        self.released = False
        self.waited_ms = waited_ms
        self.predicted_ms = predicted_ms  # its service time, when predicted (ms)
        if limiter.rates is not None:
            limiter.running.add(self)

    def sample(self, ok: bool, latency_ms: float | None = None) -> None:
        """Feed the outcome to the adaptive limit (latency defaults to time since admission)."""
        if latency_ms is None:
            latency_ms = (time.perf_counter() - self.started) * 1000
        self._limiter.on_sample(ok, latency_ms)

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self._limiter.running:
                self._limiter.ended(self, time.perf_counter())
            self._limiter.on_release(self._long, (time.perf_counter() - self.started) * 1000,
                                     low=self._low, tenant=self._tenant)


class Limiter:
    """Slots, queue and limit of one upstream. All calls happen on the event-loop thread."""

    def __init__(self, policy: AdmissionPolicy):
        self.policy = policy
        self.limit = float(policy.max_concurrency)
        self.in_flight = 0
        self.long_in_flight = 0
        self.low_in_flight = 0
        self.service_ms = 0.0  # EWMA of slot hold times, for the expected queue wait
        # (priority rank, virtual start, arrival, the waiter, long prompt, tenant)
        self._queue: list[_Entry] = []
        self._seq = itertools.count()
        self._vtime = 0.0  # the virtual start of the last waiter admitted
        self._finish: dict[str | None, float] = {}  # per tenant: its last waiter's finish
        self.held: dict[str, int] = {}  # slots held per tenant (per_key_share)
        #: The upstream's measured rates (gateway.service_time), when it reports them; then
        #: the slots held (``running``) and the waiters' service times are kept, to predict.
        self.rates: ServiceRates | None = None
        self.running: set[Slot] = set()
        #: Slots' hold time over their predicted service time (EWMA): what predictions are
        #: multiplied by, since the engine under load, the gateway's own work, and answers
        #: ending before max_tokens all move the rates measured at start-up.
        self.scale = 1.0
        self._queued_ms: dict[asyncio.Future[None], float] = {}

    @property
    def queue_depth(self) -> int:
        return sum(1 for entry in self._queue if not entry[3].done())

    def _long_cap(self) -> int:
        return max(1, int(self.limit * self.policy.long_lane_share))

    def _low_cap(self) -> int:
        return max(1, int(self.limit * self.policy.low_priority_share))

    def _key_cap(self) -> int:
        return max(1, int(self.limit * self.policy.per_key_share))

    def _can_run(self, long: bool, low: bool = False, tenant: str | None = None) -> bool:
        if self.in_flight >= int(self.limit):
            return False
        return (not long or self.long_in_flight < self._long_cap()) and (
            not low or self.low_in_flight < self._low_cap()) and (
            tenant is None or self.held.get(tenant, 0) < self._key_cap())

    def _take(self, long: bool, low: bool = False, tenant: str | None = None) -> None:
        self.in_flight += 1
        if long:
            self.long_in_flight += 1
        if low:
            self.low_in_flight += 1
        if tenant is not None:
            self.held[tenant] = self.held.get(tenant, 0) + 1

    def try_acquire(self, long: bool = False, work: Work | None = None,
                    low: bool = False, tenant: str | None = None) -> Slot | None:
        """A slot now, if one is free and no waiter could take it; else None (then
        :meth:`acquire`, which queues). Without a coroutine: most requests find a slot.
        ``work``: its service time is predicted, for the waits of those after it; ``low``:
        a low priority request (``low_priority_share``); ``tenant``: the gateway key it is
        for, where the slots are shared between keys (``per_key_share``), else None."""
        if self._queue:
            self._wake()  # after it, a free slot means no waiter could take it
        if self._can_run(long, low, tenant):
            self._take(long, low, tenant)
            rates = self.rates
            return Slot(self, long, 0.0, None if rates is None or work is None
                        else rates.service_ms(work), low, tenant)
        return None

    async def acquire(self, priority: str = "normal", long: bool = False,
                      tenant: str | None = None, slo_ms: float | None = None,
                      work: Work | None = None) -> Slot:
        """A slot, now or after queueing (``tenant``: the gateway key whose turn it takes,
        see the module docstring, and whose share of the slots it counts against, where the
        slots are shared between keys; else None); raises Shed when waiting would take too long: past the queue's bounds
        (with ``work`` and the upstream's rates, a predicted wait over ``queue_slowdown``
        times its own predicted service time), or (``slo_ms``, the client's time-to-first-
        token objective) when the expected wait alone exceeds it (``slo``), at once rather
        than late."""
        rank = PRIORITY_RANK.get(priority, 1)
        low = rank == 2
        slot = self.try_acquire(long, work, low, tenant)
        if slot is not None:
            return slot
        policy = self.policy
        depth = self.queue_depth
        start = max(self._vtime, self._finish.get(tenant, 0.0))
        predicted = self.rates.service_ms(work) if self.rates is not None and work is not None \
            and policy.queue_slowdown else None
        own_ms = None if predicted is None else predicted * self.scale
        if own_ms is None:
            expected_ms = (depth + 1) / max(self.limit, 1.0) * self.service_ms
            # Queue only when the expected wait leaves room for variance within the
            # deadline: a request that would time out in the queue is better shed now.
            full = depth >= policy.max_queue or expected_ms > policy.max_queue_wait_ms / 2
            deadline_ms = policy.max_queue_wait_ms
        else:
            # Bounded slowdown: the predicted response time (the wait, then the service at
            # the pace requests are served now, own_ms) within (1 + queue_slowdown) times
            # the service time at the engine's measured rates. A batch that already slows
            # every answer (a flood) leaves no room to wait; a few past the seats wait.
            assert predicted is not None
            expected_ms = self._predicted_wait_ms((rank, start), own_ms)
            room_ms = (1 + policy.queue_slowdown) * predicted - own_ms
            full = depth >= policy.max_queue or expected_ms > room_ms
            deadline_ms = max(policy.max_queue_wait_ms, 2 * room_ms)
        if full and not self._evict_lower(rank):
            raise Shed("queue_full", self._retry_after())
        if slo_ms is not None and expected_ms > slo_ms:
            raise Shed("slo", self._retry_after())
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._finish[tenant] = start + 1.0
        heapq.heappush(self._queue, (rank, start, next(self._seq), fut, long, tenant))
        if own_ms is not None:
            self._queued_ms[fut] = own_ms
        started = time.perf_counter()
        timer = loop.call_later(deadline_ms / 1000, self._expire, fut, tenant)
        try:
            await fut  # a slot handed over by _wake, or Shed from _expire/_evict_lower
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # handed one, then cancelled
                self.on_release(long, 0.0, sampled=False, low=low, tenant=tenant)
            raise
        finally:
            timer.cancel()
            self._queued_ms.pop(fut, None)
        return Slot(self, long, (time.perf_counter() - started) * 1000, predicted, low, tenant)

    def _predicted_wait_ms(self, key: tuple[int, float], own_ms: float) -> float:
        """When a seat frees for a request queued at ``key`` (gateway.service_time): the
        slots held end at their predicted service times (one not predicted: the mean hold
        time so far, else ``own_ms``), the waiters before it each take a seat in turn."""
        now, mean, scale = time.perf_counter(), self.service_ms or own_ms, self.scale
        remaining = [(s.predicted_ms * scale if s.predicted_ms else mean)
                     - (now - s.started) * 1000 for s in self.running]
        remaining += [mean] * (self.in_flight - len(remaining))  # held before the rates came
        ahead = sorted((e for e in self._queue if not e[3].done() and e[:2] <= key),
                       key=lambda e: e[:3])
        return predicted_wait_ms(remaining, (self._queued_ms.get(e[3], mean) for e in ahead),
                                 int(self.limit))

    def _expire(self, fut: asyncio.Future[None], tenant: str | None = None) -> None:
        if not fut.done():  # waiting for its own key's slots: the key is at its share
            capped = tenant is not None and self.held.get(tenant, 0) >= self._key_cap()
            fut.set_exception(Shed("key_share" if capped else "queue_timeout",
                                   self._retry_after()))

    def _evict_lower(self, rank: int) -> bool:
        """Make room by shedding the newest waiter of a lower priority than ``rank``."""
        victims = [e for e in self._queue if e[0] > rank and not e[3].done()]
        if not victims:
            return False
        victim = max(victims, key=lambda e: (e[0], e[2]))
        victim[3].set_exception(Shed("priority_evicted", self._retry_after()))
        return True

    def _retry_after(self) -> float:
        return max(1.0, self.service_ms / 1000)

    def ended(self, slot: Slot, now: float) -> None:
        """A slot held for predictions ended: the scale learns from its service time."""
        self.running.discard(slot)
        if slot.predicted_ms:
            self.scale = 0.8 * self.scale + 0.2 * (now - slot.started) * 1000 / slot.predicted_ms

    def on_release(self, long: bool, held_ms: float, sampled: bool = True,
                   low: bool = False, tenant: str | None = None) -> None:
        self.in_flight -= 1
        if long:
            self.long_in_flight -= 1
        if low:
            self.low_in_flight -= 1
        if tenant is not None:
            held = self.held.get(tenant, 1) - 1
            if held > 0:
                self.held[tenant] = held
            else:
                self.held.pop(tenant, None)
        if sampled:
            self.service_ms = held_ms if not self.service_ms else 0.9 * self.service_ms + \
                0.1 * held_ms
        self._wake()

    def _wake(self) -> None:
        while self._queue and self.in_flight < int(self.limit):
            entry = self._next_runnable()
            if entry is None:
                return
            if entry is self._queue[0]:
                heapq.heappop(self._queue)
            else:
                self._queue.remove(entry)
                heapq.heapify(self._queue)
            self._take(entry[4], entry[0] == 2, entry[5])
            self._vtime = max(self._vtime, entry[1])
            entry[3].set_result(None)
        if not self._queue and self._finish:
            self._finish.clear()  # no backlog: every tenant starts from now again

    def _next_runnable(self) -> _Entry | None:
        queue = self._queue
        while queue and queue[0][3].done():  # shed or cancelled waiters
            heapq.heappop(queue)
        if not queue:
            return None
        long_full = self.long_in_flight >= self._long_cap()
        low_full = self.low_in_flight >= self._low_cap()
        held, key_cap = self.held, self._key_cap()

        def runnable(e: _Entry) -> bool:
            return not (e[4] and long_full) and not (e[0] == 2 and low_full) and (
                e[5] is None or held.get(e[5], 0) < key_cap)

        if runnable(queue[0]):
            return queue[0]
        # Its lane (or its key's share) is full: the first waiter of another, in priority
        # order, goes instead.
        return next((e for e in sorted(queue) if runnable(e) and not e[3].done()), None)

    def on_sample(self, ok: bool, latency_ms: float) -> None:
        policy = self.policy
        if policy.limiter != "aimd":
            return
        if not ok or latency_ms > policy.latency_target_ms:
            self.limit = max(float(policy.min_concurrency), self.limit * policy.backoff)
        elif self.in_flight * 2 >= self.limit:
            self.limit = min(float(policy.max_limit), self.limit + 1)
            self._wake()
