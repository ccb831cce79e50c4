"""Stage ``cache``: answer from the response cache, or store the answer after its last byte.

Chat requests only (Chat Completions or Anthropic Messages), when the gateway config
enables the cache and the policy's ``[cache]`` does. A hit is served at once (``x-cache:
hit``, ``x-cache-similarity`` for a semantic one) in the caller's format: ``chat.completion``
JSON or a chunk stream, an Anthropic message or its event stream; a
miss or bypass says so in ``x-cache`` and goes on down the pipeline. What comes back is
stored (in the background) only once the client has it whole: never an error, a truncated,
broken or cancelled answer, nor one to a request another stage changed (``ctx.lossy``: its
context compressed, a degraded reroute to another model). Degraded mode may serve a near
miss instead of shedding the request, at the policy's relaxed operating point
(``x-gateway-degraded: cache:<reason>``).

**A lookup never slows a miss.** The exact layer is awaited (a dictionary look-up in
memory, one round trip to Redis). The semantic layer (embedding, vector search, verifier)
runs as a task, waited for at most ``lookup_budget_ms``; past it the request goes on down
the pipeline while the lookup goes on, the two racing:

- the lookup ends first with a hit: the rest of the pipeline is cancelled (its upstream
  connection dropped, so the upstream stops; admission slots given back) and the hit
  served, when that costs nothing: nothing sent yet, or an upstream that allows it
  (``cancel_on_late_hit``: the local engine by default; a hosted API may bill a started
  request, so it opts in per upstream). Otherwise the hit is counted (``ignored``) and the
  upstream's answer served;
- the upstream answers first: its answer is served (nothing the client has started to
  receive is ever replaced); a hit found later is counted (``too_late``).

The log line says what happened (``late_hit``: ``served``, ``ignored``, ``too_late``;
``lookup_ms``: the whole lookup, null when it outlived the answer), and so do the metrics
(``gateway_cache_over_budget_total``, ``gateway_cache_late_hits_total{outcome}``). When the
scope holds no entry at all (a conversation's later turns), the request does not wait: the
lookup only embeds, for the store. The machinery (keys, backends, verifier) is
:mod:`gateway.cache`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from gateway.cache.cache import CacheStats, Lookup, ResponseCache
from gateway.context import Headers, Next, Outcome, Reply, RequestContext
from gateway.formats.answer import Answer
from gateway.formats.ids import random_hex
from gateway.formats.usage import Usage
from gateway.policy import CachePolicy
from gateway.upstreams.base import Upstream

__all__ = ["CacheStage", "build"]

_JSON = (b"content-type", b"application/json")


def build(policy: CachePolicy, cache: ResponseCache | None,
          upstreams: Mapping[str, Upstream]) -> CacheStage | None:
    """None when the gateway has no cache (``[cache] enabled`` in its config) or the policy
    turns it off."""
    if cache is None or not policy.enabled:
        return None
    return CacheStage(cache, upstreams)


class CacheStage:
    """``upstreams``: by name, to tell whether the one a request was sent to may be
    cancelled for a late hit."""

    def __init__(self, cache: ResponseCache, upstreams: Mapping[str, Upstream]) -> None:
        self.cache = cache
        self.upstreams = upstreams

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        cache, policy = self.cache, ctx.policy.cache
        if ctx.kind != "chat":
            return await call_next(ctx)
        lookup = await cache.lookup(ctx, policy)
        if not lookup.semantic:
            return await self._known(ctx, call_next, lookup, policy)
        semantic = cache.start_semantic(ctx, policy, lookup)
        try:
            if not lookup.possible:  # a miss for sure: the task only embeds, for the store
                return await self._known(ctx, call_next, lookup, policy, semantic)
            await asyncio.wait((semantic,), timeout=policy.lookup_budget_ms / 1000)
            if semantic.done():
                return await self._known(ctx, call_next, lookup, policy)
            return await self._race(ctx, call_next, lookup, policy, semantic)
        except BaseException:  # the client left, or the pipeline failed: nothing to store
            semantic.cancel()
            raise

    async def _known(self, ctx: RequestContext, call_next: Next, lookup: Lookup,
                     policy: CachePolicy, pending: asyncio.Task[None] | None = None) -> Reply:
        """The lookup's answer is known: serve the hit, or go on and store what comes back
        (once ``pending``, the lookup's embedding for the store, is done)."""
        lookup.write(ctx.record)
        if lookup.hit is not None:
            reply = self._serve(ctx, lookup)
            if reply is not None:
                return reply
        self.cache.stats.count(lookup.result, lookup.layer or "")
        if not lookup.candidates:  # nothing to serve instead later: the header now
            ctx.response_headers.append((b"x-cache", lookup.result.encode()))
            reply = await call_next(ctx)
        else:
            header = _XCache(ctx.response_headers, lookup.result.encode())

            async def relaxed(label: str) -> Reply | None:
                return self._relaxed(ctx, lookup, policy, label, header)
            ctx.degraded_answer = relaxed
            reply = await call_next(ctx)
        self._store_when_delivered(ctx, reply, lookup, policy, pending)
        return reply

    async def _race(self, ctx: RequestContext, call_next: Next, lookup: Lookup,
                    policy: CachePolicy, semantic: asyncio.Task[None]) -> Reply:
        """The lookup is past its budget: the rest of the pipeline runs alongside it."""
        stats = self.cache.stats
        stats.over_budget += 1
        header = _XCache(ctx.response_headers, b"miss")

        async def relaxed(label: str) -> Reply | None:  # admission bounds the wait
            await asyncio.wait((semantic,))
            if not lookup.candidates:
                return None
            return self._relaxed(ctx, lookup, policy, label, header)
        ctx.degraded_answer = relaxed
        upstream = asyncio.ensure_future(call_next(ctx))
        handled = False
        try:
            await asyncio.wait((semantic, upstream), return_when=asyncio.FIRST_COMPLETED)
            if not upstream.done():  # the lookup's answer came first
                handled = True
                late = self._late(ctx, lookup, header)
                if late is not None:
                    await _cancel(upstream)
                    if ctx.upstream_started is not None:
                        ctx.upstream_ended = time.perf_counter()
                    return late
            reply = await upstream
        except BaseException:  # the client left, or the pipeline failed
            await _cancel(upstream)
            raise
        if not handled:  # the upstream's answer came first (or with the lookup's)
            ctx.record.cache, ctx.record.cache_layer = "miss", None
            stats.count("miss")
            semantic.add_done_callback(lambda _: _count_too_late(lookup, stats))
            reply.on_close(lambda _: _after_the_answer(ctx, lookup, semantic))
        self._store_when_delivered(ctx, reply, lookup, policy, semantic)
        return reply

    def _late(self, ctx: RequestContext, lookup: Lookup, header: _XCache) -> Reply | None:
        """The lookup ended while the upstream call is under way: the hit's reply, when it
        is one that may replace the call; else None (the log line says why, and so will
        ``x-cache``)."""
        rec, stats = ctx.record, self.cache.stats
        lookup.write(rec)
        if lookup.hit is None:
            stats.count(lookup.result, lookup.layer or "")
            header.set(lookup.result.encode())
            return None
        sent_to = ctx.upstream
        upstream = self.upstreams.get(sent_to) if sent_to is not None else None
        if sent_to is not None and not (upstream and upstream.cancel_on_late_hit):
            rec.cache, rec.cache_layer, rec.late_hit = "miss", None, "ignored"
            stats.count("miss")
            stats.late("ignored")
            header.set(b"miss")
            return None  # the entry stays the lookup's hit: the answer is not stored again
        reply = self._serve(ctx, lookup)
        if reply is None:
            header.set(b"miss")
            stats.count("miss")
            return None
        header.set(None)  # the hit's reply says it
        rec.late_hit = "served"
        stats.late("served")
        return reply

    def _serve(self, ctx: RequestContext, lookup: Lookup) -> Reply | None:
        """The hit's reply, counted; None (now a miss) for an entry this API cannot render
        (a tool call's arguments that are not a JSON object)."""
        try:
            reply = _hit(ctx, lookup, lookup.similarity if lookup.layer == "semantic"
                         else None)
        except ValueError:
            lookup.hit, lookup.result, lookup.layer = None, "miss", None
            ctx.record.cache, ctx.record.cache_layer = "miss", None
            return None
        self.cache.stats.count("hit", lookup.layer or "")
        return reply

    def _relaxed(self, ctx: RequestContext, lookup: Lookup, policy: CachePolicy,
                 label: str, header: _XCache) -> Reply | None:
        """A candidate at the relaxed operating point, served as a labelled hit, or None."""
        lookup.hit = ResponseCache.choose(lookup, policy.relaxed)
        if lookup.hit is None:
            return None
        ctx.record.cache, ctx.record.cache_layer = "hit", "semantic"
        header.set(None)  # the hit's reply says it
        ctx.response_headers.append((b"x-gateway-degraded", label.encode()))
        # The similarity as the log line has it: none yet when the lookup outran its budget.
        return _hit(ctx, lookup, lookup.similarity if lookup.written else None)

    def _store_when_delivered(self, ctx: RequestContext, reply: Reply, lookup: Lookup,
                              policy: CachePolicy, pending: asyncio.Task[None] | None) -> None:
        if not lookup.store or lookup.hit is not None or reply.status != 200 or ctx.lossy:
            return
        cache, api = self.cache, ctx.api
        if reply.stream is None:
            def store_body(outcome: Outcome) -> None:
                if outcome.delivered:  # the answer as dispatch parsed it
                    answer = api.answer_of(reply.json, policy.cache_tool_calls)
                    cache.store_later(lookup, answer, policy, pending)
            reply.on_close(store_body)
            return
        collector = api.collector()
        reply.taps.append(collector.feed)

        def store_stream(outcome: Outcome) -> None:
            if outcome.delivered:
                usage = ctx.usage
                counts = {"prompt_tokens": usage.prompt_tokens if usage else None,
                          "completion_tokens": usage.completion_tokens if usage else None}
                cache.store_later(lookup, collector.answer(ctx.finish_reason, counts), policy,
                                  pending)
        reply.on_close(store_stream)


class _XCache:
    """The request's ``x-cache`` header (``hit``, ``miss``, ``bypass``) in the response
    headers from the start, with the value known so far: a stream's head may go out before
    the stage's part of the request is over (an upstream accepting it, a keepalive), and
    carries it then. :meth:`set` replaces it; none when a hit is served (its reply says
    it)."""

    __slots__ = ("entry", "headers")

    def __init__(self, headers: Headers, value: bytes) -> None:
        self.headers = headers
        self.entry: tuple[bytes, bytes] | None = (b"x-cache", value)
        headers.append(self.entry)

    def set(self, value: bytes | None) -> None:
        """The value is known now (None: no header)."""
        if self.entry is not None:
            self.headers[:] = [h for h in self.headers if h is not self.entry]
        self.entry = None if value is None else (b"x-cache", value)
        if self.entry is not None:
            self.headers.append(self.entry)


async def _cancel(task: asyncio.Future[Reply]) -> None:
    """Cancel the rest of the pipeline and wait until it has unwound (its upstream
    connection closed, its slots given back); a reply it made meanwhile is closed unsent.
    (Its error, if it failed, is the caller's to raise.) A task already done (a request shed
    while its lookup ran) costs no turn of the event loop."""
    if not task.done():
        task.cancel()
        await asyncio.wait((task,))
    if not task.cancelled() and task.exception() is None:
        task.result().close(Outcome(False))


def _count_too_late(lookup: Lookup, stats: CacheStats) -> None:
    if lookup.hit is not None:
        stats.late("too_late")


def _after_the_answer(ctx: RequestContext, lookup: Lookup, semantic: asyncio.Task[None]) -> None:
    """At the end of an upstream answer that came before the lookup's: what the lookup
    found, if it has ended (the client got the upstream's answer: ``cache`` stays miss)."""
    if not semantic.done():
        return
    rec = ctx.record
    rec.similarity, rec.verified, rec.lookup_ms = lookup.similarity, lookup.verified, lookup.ms
    if lookup.hit is not None:
        rec.late_hit = "too_late"


def _hit(ctx: RequestContext, lookup: Lookup, similarity: float | None) -> Reply:
    """Serve the hit in the caller's format, as a stream when the client streams, with
    ``x-cache-similarity`` when ``similarity`` is given. Raises ValueError for an entry this
    API cannot render."""
    assert lookup.hit is not None
    answer = Answer.from_stored(lookup.stored(lookup.hit))
    headers = [(b"x-cache", b"hit")]
    if similarity is not None:
        headers.append((b"x-cache-similarity", f"{similarity:.4f}".encode()))
    ctx.model_served, ctx.finish_reason = answer.model, answer.finish_reason
    ctx.usage = Usage(answer.prompt_tokens, answer.completion_tokens)
    api = ctx.api
    id_ = api.id_prefix + random_hex()
    if ctx.stream:
        return Reply(200, headers, api.answer_events(answer, ctx.body, id_), sse=True)
    return Reply(200, [_JSON, *headers], api.answer_body(answer, id_))
