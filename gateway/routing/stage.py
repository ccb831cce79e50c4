"""The routing stage: a request for a router alias (e.g. ``model = "auto"``) gets a tier.

Runs after the cache lookup, so a cache hit never pays for routing, and reuses the
embedding the lookup computed when it embedded the same text (one embedding per request).
The decision (:class:`Decision`) lists the public models to try in order: the chosen tier's
models, then, with ``fallback``, the other tier's. Without an embedding (the embedder is
still loading, failed or timed out), the request goes to the strong tier: quality first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from gateway.policy import RouterPolicy, RoutingPolicy
from gateway.routing.features import last_user_text, text_features, user_turns
from gateway.routing.router import Router, artifact_path

__all__ = ["Decision", "RoutingStage"]

log = structlog.get_logger("gateway.routing")

Embed = Callable[[list[str]], Awaitable[np.ndarray]]
_EMBED_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Decision:
    """``tier``: the chosen tier; ``score``: P(strong needed), None without an embedding;
    ``chain``: (tier, public model) pairs in the order to try them."""

    router: str
    tier: str
    score: float | None
    threshold: float
    chain: tuple[tuple[str, str], ...]


class RoutingStage:
    """Holds the loaded router artifacts (each loaded once) and decides per request."""

    def __init__(self, embed: Embed | None = None):
        self.embed = embed
        self._routers: dict[str, Router] = {}
        self._thresholds: dict[tuple[str, float | None, float | None], float] = {}
        #: Decisions per (router, tier), for /metrics.
        self.decisions: dict[tuple[str, str], int] = {}

    def router(self, artifact: str) -> Router:
        """The loaded artifact; raises FileNotFoundError or ValueError."""
        router = self._routers.get(artifact)
        if router is None:
            router = self._routers[artifact] = Router(artifact_path(artifact))
        return router

    def check(self, policy: RoutingPolicy, models: Collection[str]) -> None:
        """Raises ValueError when the policy names unknown models, shadows a model with a
        router name, or points at an artifact that does not load."""
        for tier, names in policy.tiers.items():
            for name in names:
                if name not in models:
                    raise ValueError(f"routing.tiers.{tier}: the model '{name}' is not "
                                     "configured on this gateway")
        for name, router in policy.routers.items():
            if name in models:
                raise ValueError(f"routing.routers.{name}: a configured model has that name; "
                                 "opt it in with `models = [...]` instead")
            for model in router.models:
                if model not in models:
                    raise ValueError(f"routing.routers.{name}.models: the model '{model}' is "
                                     "not configured on this gateway")
            try:
                self.router(router.artifact)
            except (OSError, ValueError, KeyError) as exc:
                raise ValueError(f"routing.routers.{name}.artifact: cannot load "
                                 f"'{router.artifact}': {exc}") from exc

    def threshold(self, policy: RouterPolicy) -> float:
        if policy.threshold is not None:
            return policy.threshold
        key = (policy.artifact, policy.quality, policy.strong_share)
        value = self._thresholds.get(key)
        if value is None:
            value = self._thresholds[key] = self.router(policy.artifact).threshold(
                policy.quality, policy.strong_share)
        return value

    def score(self, policy: RouterPolicy, data: dict[str, Any], vector: np.ndarray) -> float:
        """The router's score for a request whose last user message embeds to ``vector``."""
        messages = data.get("messages")
        features = text_features(last_user_text(messages), user_turns(messages))
        return self.router(policy.artifact).score(vector, features)

    async def decide(self, name: str, policy: RouterPolicy, tiers: dict[str, tuple[str, ...]],
                     data: dict[str, Any], vector: np.ndarray | None = None) -> Decision:
        """Route one request; ``vector`` is the embedding of its last user message when an
        earlier stage has it. Never raises for embedding trouble (strong tier instead)."""
        if vector is None:
            vector = await self._embed(last_user_text(data.get("messages")))
        threshold = self.threshold(policy)
        score = None if vector is None else self.score(policy, data, vector)
        tier = policy.strong if score is None or score >= threshold else policy.weak
        order = [tier]
        if policy.fallback:
            order.append(policy.weak if tier == policy.strong else policy.strong)
        chain = tuple((t, model) for t in order for model in tiers[t])
        key = (name, tier)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        return Decision(name, tier, score, threshold, chain)

    async def _embed(self, text: str) -> np.ndarray | None:
        if self.embed is None:
            return None
        try:
            async with asyncio.timeout(_EMBED_TIMEOUT_S):
                return (await self.embed([text]))[0]
        except Exception as exc:  # noqa: BLE001 - no embedding: route to the strong tier
            log.warning("route_embed_failed", error=type(exc).__name__)
            return None
