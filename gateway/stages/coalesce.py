"""Stage ``coalesce``: identical requests in flight at once share one upstream call.

Chat requests (any client API) that ask for a deterministic answer (``temperature`` 0 or a
``seed``; any request under the policy's ``mode = "always"``), alike in every byte that
matters: the gateway key and cache namespace, the client API, the model asked for and the
whole parsed body (``stream`` and its options included, so each client gets the answer in
the shape it asked for). The first makes the call; those that come while it runs get the
same answer, a stream from its first byte as it arrives (a late joiner first gets what was
already sent). A client that leaves does not cancel the call while another waits; the last
one leaving does. ``x-gateway-coalesced: 1`` and the log field ``coalesced`` (``leader``,
``follower``) say so; ``gateway_coalesced_requests_total{role}`` counts them. The machinery
is :mod:`gateway.coalesce.flight`.

It runs after ``rate_limit`` (each request is counted against its key's limits) and after
``cache`` (a hit answers alone; only the leader's answer is stored), before the stages that
spend upstream capacity (route, compress, admission: only the leader takes a slot).
"""

from __future__ import annotations

import hashlib

import orjson

from gateway.cache.keys import namespace_of
from gateway.coalesce.flight import Flights
from gateway.coalesce.policy import CoalescePolicy
from gateway.context import Next, Reply, RequestContext

__all__ = ["CoalesceStage", "build"]

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def build(policy: CoalescePolicy, flights: Flights) -> CoalesceStage | None:
    """None when the policy turns it off."""
    if not policy.enabled:
        return None
    return CoalesceStage(flights, policy.mode == "always")


class CoalesceStage:
    def __init__(self, flights: Flights, always: bool) -> None:
        self.flights = flights
        self.always = always

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        body = ctx.body
        if ctx.kind != "chat" or not (self.always or body.get("temperature") == 0
                                      or body.get("seed") is not None):
            return await call_next(ctx)
        if body.get("n") not in (None, 1):  # several samples asked for: each its own
            return await call_next(ctx)
        key = hashlib.blake2b(orjson.dumps(
            [ctx.api.name, namespace_of(ctx.headers, ctx.key_id), ctx.model, body],
            option=_OPTS), digest_size=16).hexdigest()
        return await self.flights.join(key, ctx, call_next)
