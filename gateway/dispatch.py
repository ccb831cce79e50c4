"""The pipeline's terminal step: send the request to its model's targets in order, with
retries, before any byte reaches the client.

:class:`Dispatch` sends the request to the targets of the model to serve (``ctx.route``),
rewrites ``model`` for each target, asks OpenAI-style upstreams for the final usage chunk of a
stream (forwarded only to clients that asked for it), and returns the
:class:`~gateway.context.Reply`: a complete response, or an open stream whose first token has
arrived. The body each target is sent is made once per target (translated, shaped), not once
per attempt; a whole answer is parsed once, and its parsed form handed on (``Reply.json``,
and what the upstream answered into the context). :class:`Dispatcher` does the trying:

For each target (the model's ordered fallback list), up to ``max_attempts`` attempts. An
attempt is retried on :class:`~gateway.errors.UpstreamUnreachable` or a broken-off response,
and on the policy's ``retry_on_status`` (429 and 5xx). The wait before attempt n+1 is the
upstream's ``Retry-After``/``retry-after-ms`` when given (a longer one than
``max_retry_after_ms`` moves on to the next target at once), else exponential backoff with
full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015). A read timeout is
not retried: the upstream may still be working on it. When every attempt fails with a status,
the last upstream response is returned as it is, so the client sees the upstream's own error.

A streaming attempt lasts until its first token (:mod:`gateway.stream_watch`), failures before
it retried too; then the caller owns the stream and its slot (released when the stream ends).

Before a target is tried, its circuit breaker must allow it and its limiter must admit the
request (:mod:`gateway.concurrency`); a target that cannot take it is skipped, and when no
target could, :class:`~gateway.concurrency.Shed` is raised for the degraded-mode actions. Every
attempt after the first spends from the retry budget (:mod:`gateway.retry_budget`); when it
is empty the request ends with what it has.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from gateway import jsonio
from gateway.affinity import Affinity
from gateway.balance import arrange
from gateway.concurrency import Shed, Slot
from gateway.config import Target
from gateway.context import Reply, RequestContext
from gateway.continuation import client_stream
from gateway.errors import FirstTokenTimeout, NoUpstreamAvailable, UpstreamError, UpstreamTimeout
from gateway.formats.translator import Translator
from gateway.guard import Guard
from gateway.hedge import HedgeBudget, race
from gateway.http import forward_response_headers, retry_after_ms
from gateway.models import model_key, model_not_found
from gateway.opened import Opened
from gateway.outbound import Outbound, observe
from gateway.policy import Policy, RetryPolicy
from gateway.retry_budget import RetryBudget
from gateway.service_time import work_of
from gateway.stream_watch import StreamWatch
from gateway.tracing import as_hedge
from gateway.upstreams.base import (
    RawHeaders,
    Upstream,
    UpstreamRequest,
    WholeResponse,
)

__all__ = ["Dispatch", "Dispatcher", "Guard", "Opened", "backoff_ms"]

R = TypeVar("R", bound="WholeResponse | Opened")


def backoff_ms(attempt: int, policy: RetryPolicy, rand: Callable[[], float]) -> float:
    """Full-jitter delay before retry ``attempt`` (1-based), in ms."""
    cap = min(float(policy.max_delay_ms), policy.base_delay_ms * 2.0 ** (attempt - 1))
    return rand() * cap


class Dispatcher:
    def __init__(
        self,
        upstreams: dict[str, Upstream],
        policy: Policy,
        *,
        rand: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.upstreams = upstreams
        self.guards = {name: Guard(policy, u.capacity) for name, u in upstreams.items()}
        for name, u in upstreams.items():
            u.on_capacity(self.guards[name].set_capacity)
        self.budget = RetryBudget(policy.retry_budget)
        #: Hedges (gateway.hedge) spent per hedged request, as the retry budget.
        self.hedges = HedgeBudget(policy.balance.hedge_budget)
        self.affinity = Affinity()  # the "affinity" models' conversations and targets
        self.watch = StreamWatch()  # first-token deadlines, stalls: gateway.stream_watch
        self._rand = rand
        self._sleep = sleep

    def update(self, policy: Policy) -> None:
        """A new policy: limits, breakers and the retry budget follow it, state kept."""
        for guard in self.guards.values():
            guard.update(policy)
        self.budget.policy = policy.retry_budget
        self.hedges.set_ratio(policy.balance.hedge_budget)

    # unary and stream return _run's coroutine rather than awaiting it: one frame less in
    # the await chain, which every resumption of the request walks.
    #
    # ``ctx``: the request's policy snapshot and admission ticket are read from it; the
    # upstream tried, the time queued for slots, the retries and the first attempt's start
    # are written into it.
    def unary(
        self,
        targets: Sequence[Target],
        build: Callable[[Target], UpstreamRequest],
        ctx: RequestContext,
    ) -> Awaitable[tuple[Target, WholeResponse]]:
        def attempt(upstream: Upstream, target: Target) -> Awaitable[WholeResponse]:
            return upstream.send(build(target))

        return self._run(targets, attempt, ctx)

    def stream(
        self,
        targets: Sequence[Target],
        build: Callable[[Target], UpstreamRequest],
        ctx: RequestContext,
        head: Callable[[str], bytes] | None = None,
    ) -> Awaitable[tuple[Target, WholeResponse | Opened]]:
        """``head``: the client's opening events for the model asked (Translator.head),
        sent with the head once an upstream accepts."""
        async def attempt(upstream: Upstream, target: Target) -> WholeResponse | Opened:
            response = await upstream.stream(build(target))
            try:
                if response.status != 200:
                    return WholeResponse(response.status, response.headers, await response.read())
                if ctx.accepted is not None:  # the client's head now, before the first event
                    await ctx.accepted(_stream_headers(response.headers),
                                       b"" if head is None else head(target.model))
                chunks, first = await watch.opening(response, target)  # to its first token
            except BaseException:
                response.close()
                raise
            return Opened(response, chunks, first)

        watch = self.watch.attempts(ctx, targets, self)
        return self._run(targets, watch.timed(attempt), ctx)

    async def _run(
        self,
        targets: Sequence[Target],
        attempt: Callable[[Upstream, Target], Awaitable[R]],
        ctx: RequestContext,
    ) -> tuple[Target, R]:
        retry, ticket, balance = ctx.policy.retry, ctx.ticket, ctx.policy.balance
        last: tuple[Target, R] | None = None
        error: UpstreamError | None = None
        shed: Shed | None = None
        tries = 0
        self.budget.deposit()
        if ctx.trace is not None:
            attempt = ctx.trace.traced(attempt, ctx.kind)
        for target in targets:
            upstream = self.upstreams[target.upstream]
            if not upstream.enabled:
                continue
            guard = self.guards[target.upstream]
            if not guard.breaker.allow():
                shed = Shed("breaker_open", guard.breaker.retry_after_s())
                continue
            slot: Slot | None = None
            if ticket is not None:  # admission control is on
                work = None if guard.limiter.rates is None else work_of(ctx.body, len(ctx.raw))
                slot = guard.limiter.try_acquire(ticket.long, work, ticket.priority == "low",
                                                 ticket.tenant)
                if slot is None:
                    try:
                        slot = await guard.limiter.acquire(ticket.priority, ticket.long,
                                                           ticket.tenant, ctx.slo_ms, work)
                    except Shed as exc:
                        shed = exc
                        continue
                if slot.waited_ms:
                    ctx.queue_ms = round(ctx.queue_ms + slot.waited_ms, 3)
            if ctx.upstream_started is None:
                ctx.upstream_started = time.perf_counter()
            ctx.upstream, ctx.model_served = target.upstream, target.model
            try:
                for n in range(1, retry.max_attempts + 1):
                    if tries:
                        if not self.budget.withdraw():
                            return _give_up(last, error)
                        ctx.retries += 1
                    tries += 1
                    started = time.perf_counter()
                    ewma = guard.ewma
                    ewma.pending += 1
                    try:
                        result = await attempt(upstream, target)
                    except UpstreamError as exc:
                        ewma.pending -= 1
                        ewma.observe(balance.failure_penalty_ms, balance.decay_s)
                        guard.breaker.record(False)
                        if slot is not None:
                            slot.sample(False)
                        if isinstance(exc, UpstreamTimeout):
                            raise
                        error, last = exc, None
                        if isinstance(exc, FirstTokenTimeout) and exc.next_target:
                            break
                        delay = backoff_ms(n, retry, self._rand)
                    except BaseException:
                        ewma.pending -= 1
                        raise
                    else:
                        ewma.pending -= 1
                        status = result.status
                        ok = status < 500 and status != 429
                        ewma.observe((time.perf_counter() - started) * 1000 if ok
                                     else balance.failure_penalty_ms, balance.decay_s)
                        hinted = retry_after_ms(result.headers) if not ok else None
                        if isinstance(result, Opened):  # its outcome is known at its end
                            result.breaker = guard.breaker
                        else:
                            guard.breaker.record(ok, hinted)
                        if slot is not None:
                            slot.sample(ok, (time.perf_counter() - started) * 1000)
                        if status not in retry.retry_on_status:
                            if isinstance(result, Opened):
                                result.slot, slot = slot, None  # the caller releases it
                            return target, result
                        error, last = None, (target, result)
                        if hinted is not None and hinted > retry.max_retry_after_ms:
                            break
                        delay = hinted if hinted is not None else backoff_ms(n, retry, self._rand)
                    if n < retry.max_attempts:
                        await self._sleep(delay / 1000)
            finally:
                if slot is not None:
                    slot.release()
        if last is not None or error is not None:
            return _give_up(last, error)
        if shed is not None:
            raise shed
        raise NoUpstreamAvailable(
            "no upstream is available for this model (are the upstreams' API keys set?)"
        )


class Dispatch:
    """The terminal step of every pipeline: ``await dispatch(ctx)`` -> Reply, in the client's
    format. A target whose upstream speaks the other API gets the request translated
    (:mod:`gateway.formats.bridge`), and its answer, whole or streamed, is translated back;
    otherwise the client's bytes go as they came (``model`` rewritten when it differs).

    Raises ModelNotFound when ``ctx.route`` is None (a router alias no stage resolved),
    Shed when no target could take the request, UpstreamError (and subclasses) when every
    attempt failed without a status, NoUpstreamAvailable when the model has no enabled
    upstream.
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    async def __call__(self, ctx: RequestContext) -> Reply:
        route = ctx.route
        if route is None:
            raise model_not_found(ctx.target)
        dispatcher, bodies = self.dispatcher, Outbound(ctx, self.dispatcher.upstreams)
        targets: Sequence[Target] = route.targets
        balance = ctx.policy.balance
        build: Callable[[Target], UpstreamRequest] = bodies.request
        if balance.models:  # (a family's own entry, else its pattern's: model_key)
            targets, build = arrange(balance, model_key(route.name, route, balance.models),
                                     targets, dispatcher.guards, dispatcher.affinity,
                                     ctx.body, build)
        hedge = balance.hedge_after_ms
        hedge_ms = hedge.get(model_key(route.name, route, hedge)) if hedge else None
        early = bodies.early(targets) if ctx.accepted is not None else None
        if hedge_ms is not None and len(targets) > 1:
            target, opened = await self._hedged(targets, bodies, ctx, hedge_ms / 1000, early)
            crossing = bodies.crossing(target)
            if isinstance(opened, Opened):
                return self._stream_reply(opened, target, targets, bodies, ctx, early)
            response = opened
        elif ctx.stream:
            target, opened = await dispatcher.stream(targets, build, ctx,
                                                     None if early is None else early.head)
            crossing = bodies.crossing(target)
            if isinstance(opened, Opened):
                return self._stream_reply(opened, target, targets, bodies, ctx, early)
            response = opened  # the upstream refused with a status: pass it on
        else:
            target, response = await dispatcher.unary(targets, build, ctx)
            crossing = bodies.crossing(target)
        ctx.upstream_ended = time.perf_counter()
        try:
            obj = jsonio.loads(response.body)  # the one parse of the answer
        except jsonio.JSONDecodeError:
            obj = None
        observe(response.status, obj, ctx)
        headers = forward_response_headers(response.headers)
        if crossing is None:
            return Reply(response.status, headers, response.body, json=obj)
        if response.status == 200:
            out = crossing.response(obj, ctx.body)
            return Reply(200, headers, jsonio.dumps(out), json=out)
        status, error = crossing.error(response.status, obj)
        if isinstance(inner := error.get("error"), dict) and isinstance(inner.get("type"), str):
            ctx.record.error_type = inner["type"]  # the log says what the client reads
        return Reply(status, headers, jsonio.dumps(error), json=error)

    def _stream_reply(self, opened: Opened, target: Target, targets: Sequence[Target],
                      bodies: Outbound, ctx: RequestContext, early: Translator | None) -> Reply:
        headers = _stream_headers(opened.response.headers)
        stream = client_stream(opened, self.dispatcher, bodies, ctx, target, targets, early)
        return Reply(200, headers, stream=stream, hide_usage=bodies.hide_usage)

    async def _hedged(self, targets: Sequence[Target], bodies: Outbound, ctx: RequestContext,
                      after_s: float, early: Translator | None
                      ) -> tuple[Target, WholeResponse | Opened]:
        """The request raced on the model's targets (:func:`gateway.hedge.race`): the
        primary on all of them in order, the hedge on the second onwards."""
        dispatcher, retry_on = self.dispatcher, ctx.policy.retry.retry_on_status
        head = None if early is None else early.head

        def run(targets: Sequence[Target], build: Callable[[Target], UpstreamRequest],
                ctx: RequestContext) -> Awaitable[tuple[Target, WholeResponse | Opened]]:
            return dispatcher.stream(targets, build, ctx, head) if ctx.stream \
                else dispatcher.unary(targets, build, ctx)
        dispatcher.hedges.deposit()
        started = time.perf_counter()
        spare = dispatcher.guards[targets[1].upstream].limiter

        def allowed() -> bool:  # never queued: a hedge only where a slot is free now
            free = ctx.ticket is None or spare.in_flight < int(spare.limit)
            return free and dispatcher.hedges.allowed()
        (target, result), hedged = await race(
            lambda: run(targets, bodies.request, ctx),
            lambda: run(targets[1:], bodies.request, ctx) if ctx.trace is None
            else as_hedge(run(targets[1:], bodies.request, ctx)),
            after_s, allowed, lambda r: r[1].status in retry_on, lambda r: _close(r[1]))
        if hedged:
            ctx.record.hedged = True
            ctx.upstream, ctx.model_served = target.upstream, target.model  # the winner's
        dispatcher.hedges.answered(time.perf_counter() - started > after_s)
        return target, result


def _stream_headers(raw: RawHeaders) -> list[tuple[bytes, bytes]]:
    """An upstream stream's headers the client's stream is sent (its own SSE type kept)."""
    return [h for h in forward_response_headers(raw) if h[0] not in (b"content-type",
                                                                     b"cache-control")]


def _close(result: WholeResponse | Opened) -> None:
    """A hedge's losing result: a stream closed (its slot given back)."""
    if isinstance(result, Opened):
        result.close()


def _give_up(last: tuple[Target, R] | None, error: UpstreamError | None) -> tuple[Target, R]:
    if last is not None:
        return last
    assert error is not None
    raise error
