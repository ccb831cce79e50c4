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
The machinery (keys, backends, verifier) is :mod:`gateway.cache`.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from gateway.cache.cache import Lookup, ResponseCache
from gateway.context import Outcome, Reply, RequestContext
from gateway.formats.answer import Answer
from gateway.pipeline import Next
from gateway.policy import CachePolicy

if TYPE_CHECKING:
    from gateway.policy import Policy
    from gateway.state import Gateway

__all__ = ["CacheStage", "build"]

_JSON = (b"content-type", b"application/json")


def build(gateway: Gateway, policy: Policy) -> CacheStage | None:
    """None when the gateway has no cache or the policy turns it off."""
    if gateway.cache is None or not policy.cache.enabled:
        return None
    return CacheStage(gateway.cache)


class CacheStage:
    def __init__(self, cache: ResponseCache) -> None:
        self.cache = cache

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        cache, policy = self.cache, ctx.policy.cache
        if ctx.kind != "chat":
            return await call_next(ctx)
        lookup = await cache.lookup(ctx, policy)
        if lookup.hit is not None:
            try:
                return _hit(ctx, lookup)
            except ValueError:  # an entry this API cannot render (a tool call's arguments
                lookup.hit = None  # that are not a JSON object): a miss
                ctx.record.cache, ctx.record.cache_layer = "miss", None
        ctx.response_headers.append((b"x-cache", (ctx.record.cache or "bypass").encode()))
        if lookup.candidates:
            async def relaxed(label: str) -> Reply | None:
                return self._relaxed(ctx, lookup, policy, label)
            ctx.degraded_answer = relaxed
        reply = await call_next(ctx)
        if lookup.store and lookup.hit is None and reply.status == 200 and not ctx.lossy:
            self._store_when_delivered(ctx, reply, lookup, policy)
        return reply

    def _relaxed(self, ctx: RequestContext, lookup: Lookup, policy: CachePolicy,
                 label: str) -> Reply | None:
        """A candidate at the relaxed operating point, served as a labelled hit, or None."""
        lookup.hit = ResponseCache.choose(lookup, policy.relaxed)
        if lookup.hit is None:
            return None
        ctx.record.cache, ctx.record.cache_layer = "hit", "semantic"
        ctx.response_headers[:] = [h for h in ctx.response_headers if h[0] != b"x-cache"]
        ctx.response_headers.append((b"x-gateway-degraded", label.encode()))
        return _hit(ctx, lookup)

    def _store_when_delivered(self, ctx: RequestContext, reply: Reply, lookup: Lookup,
                              policy: CachePolicy) -> None:
        cache, rec, api = self.cache, ctx.record, ctx.api
        if reply.stream is None:
            def store_body(outcome: Outcome) -> None:
                if outcome.delivered:
                    answer = api.answer_from_body(reply.body, policy.cache_tool_calls)
                    cache.store_later(lookup, answer, policy)
            reply.on_close(store_body)
            return
        collector = api.collector()
        reply.taps.append(collector.feed)

        def store_stream(outcome: Outcome) -> None:
            if outcome.delivered:
                usage = {"prompt_tokens": rec.prompt_tokens,
                         "completion_tokens": rec.completion_tokens}
                cache.store_later(lookup, collector.answer(rec.finish_reason, usage), policy)
        reply.on_close(store_stream)


def _hit(ctx: RequestContext, lookup: Lookup) -> Reply:
    """Serve the hit in the caller's format, as a stream when the client streams."""
    assert lookup.hit is not None
    rec = ctx.record
    answer = Answer.from_bytes(lookup.hit.answer)
    headers = [(b"x-cache", b"hit")]
    if rec.similarity is not None and rec.cache_layer == "semantic":
        headers.append((b"x-cache-similarity", f"{rec.similarity:.4f}".encode()))
    rec.model_served, rec.finish_reason = answer.model, answer.finish_reason
    rec.prompt_tokens, rec.completion_tokens = answer.prompt_tokens, answer.completion_tokens
    api = ctx.api
    id_ = api.id_prefix + uuid.uuid4().hex
    if ctx.stream:
        return Reply(200, headers, api.answer_events(answer, ctx.body, id_), sse=True)
    return Reply(200, [_JSON, *headers], api.answer_body(answer, id_))
