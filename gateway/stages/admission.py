"""Stage ``admission``: limits on arrival, a slot for the model, and degraded mode when the
request cannot be admitted.

Gateway-wide and per-key limits are checked on arrival (429 for a key's own limit, 503
beyond the gateway's); a model with its own ``model_max_concurrency`` queues the request
for a slot; the request's priority and prompt size (:class:`~gateway.context.Ticket`) decide
how it queues there and at its upstreams' limiters (:mod:`gateway.concurrency`). When no
target can take it (queue full or timed out, breakers open:
:class:`~gateway.concurrency.Shed`), the policy's degraded actions run in order:

- ``cache``: serve it from the semantic cache at the policy's relaxed operating point
  (``cache.relaxed``), if an earlier stage offered that, waiting at most
  ``degraded.cache_wait_ms`` for a lookup still under way (under a flood the embedder is
  behind, and a shed answer must stay fast); the answer says
  ``x-gateway-degraded: cache:<reason>``;
- ``compress``: cut its context harder (``compression.degraded_ratio``), if an earlier stage
  offered that, and try again; the answer says ``x-gateway-degraded: compressed:<reason>``;
- ``reroute``: serve it from ``degraded.reroute_model`` instead (a small tier or the local
  engine); the answer says ``x-gateway-degraded: rerouted:<reason>``;
- ``reject``: answer at once with 503, ``Retry-After`` and ``{"error": {"type":
  "overloaded_error", "code": "degraded_mode"}}``.

Never a silent timeout: every degraded answer is labelled in its headers and its log line.
While an earlier stage still has another target to try (the route stage's other tier), a
shed request goes back to it first. Slots and counts are held until the reply's last byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING

from gateway.concurrency import PRIORITY_RANK, AdmissionPolicy, Shed
from gateway.context import Next, Outcome, Reply, RequestContext, Ticket
from gateway.entry_limits import EntryLimits, ModelLimiters
from gateway.errors import InvalidRequest
from gateway.metrics import Metrics
from gateway.models import model_key

if TYPE_CHECKING:
    from gateway.models import ModelTable

__all__ = ["AdmissionStage", "build", "ticket"]


async def _within(answer: Awaitable[Reply | None], wait_ms: float) -> Reply | None:
    """``answer``'s reply, or None when it is not known within ``wait_ms``."""
    try:
        return await asyncio.wait_for(answer, wait_ms / 1000)
    except TimeoutError:
        return None


def build(limits: EntryLimits, model_limiters: ModelLimiters, metrics: Metrics,
          models: ModelTable) -> AdmissionStage:
    """Always on: its limits come from each request's policy snapshot (``[admission]``)."""
    return AdmissionStage(limits, model_limiters, metrics, models)


def ticket(policy: AdmissionPolicy, key_id: str | None, headers: Iterable[tuple[bytes, bytes]],
           size: int, tickets: Mapping[tuple[str, bool], Ticket] | None = None) -> Ticket:
    """The key's priority (``key_priority``, else normal), or the ``x-gateway-priority``
    header's: a lower one always, a higher one up to the key's ``key_max_priority`` (without
    gateway keys, ``key_id`` None: as asked); a body over ``long_prompt_bytes`` goes to the
    long-prompt lane. ``tickets``: the key's own (:meth:`AdmissionStage.tickets`), where
    slots are shared between keys."""
    own: str = policy.key_priority.get(key_id, "normal") if key_id else "normal"
    priority = own
    for k, v in headers:
        if k == b"x-gateway-priority":
            asked = v.decode("latin-1").strip().lower()
            rank = PRIORITY_RANK.get(asked)
            if rank is None:
                continue
            if key_id is None or rank >= PRIORITY_RANK[own]:
                priority = asked
            else:  # higher than its own: as high as the key may go
                ceiling: str = policy.key_max_priority.get(key_id, own)
                priority = asked if rank >= PRIORITY_RANK[ceiling] else \
                    min(own, ceiling, key=PRIORITY_RANK.__getitem__)
    return (tickets or _TICKETS)[priority, size > policy.long_prompt_bytes]


def slo_ms(headers: list[tuple[bytes, bytes]]) -> float | None:
    """The client's ``x-gateway-ttft-slo-ms`` (a positive number), else None; raises
    InvalidRequest for anything else."""
    for k, v in headers:
        if k == b"x-gateway-ttft-slo-ms":
            try:
                value = float(v)
            except ValueError:
                value = -1.0
            if not 0 < value < float("inf"):
                raise InvalidRequest("x-gateway-ttft-slo-ms must be a positive number of "
                                     "milliseconds", param="x-gateway-ttft-slo-ms")
            return value
    return None


#: The tickets there can be, made once (a Ticket is immutable; a frozen dataclass is slow to
#: make, and every request gets one).
_TICKETS = {(priority, long): Ticket(priority, long) for priority in PRIORITY_RANK
            for long in (False, True)}


class AdmissionStage:
    def __init__(self, limits: EntryLimits, model_limiters: ModelLimiters, metrics: Metrics,
                 models: ModelTable) -> None:
        self.limits = limits
        self.model_limiters = model_limiters
        self.metrics = metrics
        self.models = models
        self._tickets: dict[str, dict[tuple[str, bool], Ticket]] = {}

    def tickets(self, key_id: str | None) -> Mapping[tuple[str, bool], Ticket] | None:
        """The tickets of ``key_id``'s requests, naming it as their tenant, where the slots
        are shared between keys (``per_key_share``); else None (the shared ones, no
        tenant). Made once per key (key ids come from the config)."""
        if key_id is None or not self.limits.shared:
            return None
        tickets = self._tickets.get(key_id)
        if tickets is None:
            tickets = self._tickets[key_id] = {
                (priority, long): Ticket(priority, long, key_id)
                for priority in PRIORITY_RANK for long in (False, True)}
        return tickets

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        policy = ctx.policy.admission
        if policy.enabled:  # (the headers read only when they name a priority, an SLO)
            first = ctx.header_first
            ctx.ticket = ticket(policy, ctx.key_id, ctx.headers if b"x-gateway-priority" in
                                first else (), len(ctx.raw),
                                self.tickets(ctx.key_id) if self.limits.shared else None)
            if b"x-gateway-ttft-slo-ms" in first:
                ctx.slo_ms = slo_ms(ctx.headers)
        try:
            return await self._admit(ctx, call_next)
        except Shed as exc:
            if ctx.fallbacks_left:
                raise
            return await self._degrade(ctx, call_next, exc)

    async def _admit(self, ctx: RequestContext, call_next: Next) -> Reply:
        """Count the request in, take its model's slot, serve; all held until the reply
        ends. Raises Overloaded/TenantLimited on arrival limits, Shed when no slot."""
        policy, key_id = ctx.policy.admission, ctx.key_id
        self.limits.enter(policy, key_id, self.metrics.in_flight,
                          ctx.policy.degraded.min_retry_after_s)
        slot = None
        try:
            limiter = self.model_limiters.get(  # a family's own, or its pattern's
                model_key(ctx.target, ctx.route, policy.model_max_concurrency), policy)
            if limiter is not None and ctx.ticket is not None:
                tenant = ctx.ticket.tenant
                slot = limiter.try_acquire(ctx.ticket.long, None, ctx.ticket.priority == "low",
                                           tenant) \
                    or await limiter.acquire(ctx.ticket.priority, ctx.ticket.long, tenant,
                                             ctx.slo_ms)
            reply = await call_next(ctx)
        except BaseException:
            if slot is not None:
                slot.release()
            self.limits.leave(policy, key_id)
            raise

        def release(outcome: Outcome) -> None:
            if slot is not None:
                slot.release()
            self.limits.leave(policy, key_id)

        reply.on_close(release)
        return reply

    async def _degrade(self, ctx: RequestContext, call_next: Next, shed: Shed) -> Reply:
        """Run the degraded actions; raises Overloaded when every one is exhausted."""
        policy, rec = ctx.policy.degraded, ctx.record
        for action in policy.actions:
            if action == "reject":
                break
            if action == "cache" and ctx.degraded_answer is not None:
                label = f"cache:{shed.reason}"
                reply = await _within(ctx.degraded_answer(label), policy.cache_wait_ms)
                if reply is not None:
                    rec.shed = label
                    return reply
            if action == "compress" and ctx.degraded_compress is not None:
                label = f"compressed:{shed.reason}"
                if await ctx.degraded_compress(label):
                    rec.shed = label
                    if ctx.ticket is not None:  # a smaller prompt may leave the long lane
                        ctx.ticket = ticket(ctx.policy.admission, ctx.key_id, ctx.headers,
                                            len(ctx.raw), self.tickets(ctx.key_id))
                    try:
                        return await self._admit(ctx, call_next)
                    except Shed as exc:
                        shed = exc
            reroute = self.models.get(policy.reroute_model or "") \
                if action == "reroute" else None
            if reroute is not None and reroute is not ctx.route:
                assert policy.reroute_model is not None
                label = f"rerouted:{shed.reason}"
                header = (b"x-gateway-degraded", label.encode())
                rec.shed = label
                ctx.response_headers.append(header)
                ctx.target, ctx.route = policy.reroute_model, reroute
                ctx.lossy = True  # another model's answer: not cached as this one's
                try:
                    return await self._admit(ctx, call_next)
                except Shed as exc:
                    shed = exc
                    ctx.response_headers.remove(header)
        rec.shed = shed.reason
        raise shed.overloaded(policy.min_retry_after_s)
