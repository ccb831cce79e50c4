"""Stage ``route``: a request for a router alias (``model = "auto"``) gets a tier, and the
other tier when the chosen one fails or sheds.

The router scores the last user message (``ctx.last_user_text``, its embedding shared with
the cache through ``ctx.embeddings``; :mod:`gateway.routing`) and names the tier; the
request is served by the tier's models in order, then, with ``fallback``, by the other
tier's. A model is abandoned for the next while nothing has reached the client: a 5xx, a
429, an unreachable upstream, a prompt too long for its context (``context_length_exceeded``)
or shedding. The decision goes into ``x-route-tier``, ``x-route-score`` and
``x-route-fallback`` and the log line. Explicit model names pass through untouched, unless
a router opts them in (``routing.routers.NAME.models``). With ``sticky`` (the default), a
conversation keeps its tier across turns and may only rise to the strong one
(:mod:`gateway.routing.sticky`: switching models forfeits the provider's prompt cache); a
turn kept on the strong tier, or on the weak one for the very text it was scored on (a
tool-call loop), is not scored again (``route_sticky`` in the log line).
"""

from __future__ import annotations

import time

import structlog

from gateway.concurrency import Shed
from gateway.context import Next, Outcome, Reply, RequestContext
from gateway.errors import NoUpstreamAvailable, Overloaded, UpstreamError, UpstreamTimeout
from gateway.models import ModelTable
from gateway.policy import RouterPolicy, RoutingPolicy
from gateway.routing.decision import RouteDecision, Routers
from gateway.routing.features import user_turns
from gateway.routing.sticky import conversation_id, scored_digest

__all__ = ["RouteStage", "build", "failed_status"]

log = structlog.get_logger("gateway.routing")


def build(routing: RoutingPolicy, routers: Routers, models: ModelTable) -> RouteStage | None:
    """None when the policy has no router (nothing to route). ``models``: to resolve each
    tier's models (``ctx.route``)."""
    if not routing.enabled or not routing.routers:
        return None
    return RouteStage(routers, routing, models)


class RouteStage:
    def __init__(self, routers: Routers, routing: RoutingPolicy, models: ModelTable) -> None:
        self.routers = routers
        self.models = models
        #: The router aliases clients may send as ``model``.
        self.aliases = frozenset(routing.routers) if routing.enabled else frozenset()

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        routing = ctx.policy.routing
        routed = routing.router_for(ctx.model) if ctx.kind == "chat" else None
        route = ctx.route
        if routed is None and route is not None and route.pattern is not None \
                and ctx.kind == "chat":  # a family opted in by its pattern
            routed = routing.router_for(route.pattern)
        if routed is None:
            return await call_next(ctx)
        decision = await self._decide(ctx, *routed)
        last, fallback = len(decision.chain) - 1, None
        for i, (tier, model) in enumerate(decision.chain):
            if tier != decision.tier and fallback != tier:
                fallback = ctx.record.route_fallback = tier
                ctx.response_headers.append((b"x-route-fallback", tier.encode()))
            ctx.target, ctx.route = model, self.models.get(model)
            ctx.fallbacks_left = last - i
            try:
                reply = await call_next(ctx)
            except (Shed, Overloaded) as exc:
                if i == last:
                    raise
                reason = exc.reason
            except (UpstreamError, NoUpstreamAvailable) as exc:
                if i == last or isinstance(exc, UpstreamTimeout):
                    raise
                reason = exc.code or exc.type
            else:
                if i == last or not failed_status(reply):
                    return reply
                reply.close(Outcome(False))
                reason = f"status {reply.status}"
            log.info("route_fallback", request_id=ctx.request_id, tier=tier, model=model,
                     reason=reason)
        raise NoUpstreamAvailable("no model of the routed tiers is available")

    async def _decide(self, ctx: RequestContext, name: str, router: RouterPolicy
                      ) -> RouteDecision:
        """Choose the tier; the decision goes into the log line and the response headers."""
        started = time.perf_counter()
        routers, tiers = self.routers, ctx.policy.routing.tiers
        conversation, continues = conversation_id(ctx.key_id, name, ctx.chat) \
            if router.sticky else (None, False)
        held, scored = (None, None) if conversation is None \
            else routers.conversations.get(conversation)
        depth = user_turns(ctx.chat.get("messages"))
        asked = None if conversation is None else scored_digest(ctx.last_user_text, depth)
        kept = continues and held is not None and (held == router.strong or asked == scored)
        if kept and held is not None:  # strong, or weak for the text it was scored on
            decision = routers.kept(name, router, tiers, held)
            ctx.record.route_sticky = True
        else:
            decision = await routers.decide(name, router, tiers, ctx.last_user_text, depth,
                                            ctx.embeddings)
            scored = asked
        # a decision without a score (no embedding yet) is not kept for the conversation
        if conversation is not None and (kept or decision.score is not None):
            routers.conversations.put(
                conversation, router.strong if held == router.strong else decision.tier, scored)
        rec = ctx.record
        rec.route_ms = round((time.perf_counter() - started) * 1000, 3)
        rec.router, rec.route_tier = name, decision.tier
        rec.route_threshold = round(decision.threshold, 4)
        ctx.response_headers.append((b"x-route-tier", decision.tier.encode()))
        if decision.score is not None:
            rec.route_score = round(decision.score, 4)
            ctx.response_headers.append((b"x-route-score", f"{decision.score:.4f}".encode()))
        return decision


def failed_status(reply: Reply) -> bool:
    """Worth the next tier: 5xx, 429, or a prompt too long for this model's context (the
    other tier may have a longer one): OpenAI's ``context_length_exceeded``, Anthropic's
    "prompt is too long" ``invalid_request_error``."""
    if reply.status >= 500 or reply.status == 429:
        return True
    if reply.status == 400 and b"prompt is too long" in reply.body:
        return True
    if reply.status == 400 and b"context_length_exceeded" in reply.body:
        body = reply.json  # parsed by dispatch
        error = body.get("error") if isinstance(body, dict) else None
        return isinstance(error, dict) and error.get("code") == "context_length_exceeded"
    return False
