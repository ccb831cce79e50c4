"""Routers by name: their loaded artifacts, thresholds and per-request decisions. (The
pipeline stage that uses them is :mod:`gateway.stages.route`.)

A request for a router alias (e.g. ``model = "auto"``) gets a tier. The decision reuses an
embedding of the same text that an earlier stage computed (one embedding per request).
The decision (:class:`RouteDecision`) lists the public models to try in order: the chosen
tier's models, then, with ``fallback``, the other tier's. Without an embedding (the embedder
is still loading, failed or timed out), the request goes to the strong tier: quality first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import structlog

from gateway.embedding import Embed, EmbeddingMemo
from gateway.policy import RouterPolicy, RoutingPolicy
from gateway.routing.difficulty import Router, artifact_path
from gateway.routing.features import text_features
from gateway.routing.sticky import ConversationTiers

__all__ = ["RouteDecision", "Routers"]

log = structlog.get_logger("gateway.routing")

_EMBED_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """``tier``: the chosen tier; ``score``: P(strong needed), None without an embedding;
    ``chain``: (tier, public model) pairs in the order to try them."""

    tier: str
    score: float | None
    threshold: float
    chain: tuple[tuple[str, str], ...]


class Routers:
    """Holds the loaded router artifacts and decides per request. An artifact is read once,
    and again by :meth:`check` (start-up, each policy reload) when its file has changed:
    replace the file, then save the policy, and the new artifact routes."""

    def __init__(self, embed: Embed | None = None):
        self.embed = embed
        self._routers: dict[str, Router] = {}
        self._stamps: dict[str, tuple[int, int]] = {}  # artifact -> (mtime_ns, size)
        self._thresholds: dict[tuple[str, float | None, float | None], float] = {}
        #: Decisions per (router, tier), for /metrics.
        self.decisions: dict[tuple[str, str], int] = {}
        #: Each routed conversation's tier (``sticky`` routers; kept across policy reloads).
        self.conversations = ConversationTiers()

    def router(self, artifact: str) -> Router:
        """The loaded artifact; raises FileNotFoundError or ValueError."""
        router = self._routers.get(artifact)
        return router if router is not None else self._load(artifact)

    def _load(self, artifact: str) -> Router:
        """(Re)read the artifact if its file changed since it was loaded; a file that fails
        to load raises and leaves the loaded one in place."""
        path = artifact_path(artifact)
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        router = self._routers.get(artifact)
        if router is None or self._stamps.get(artifact) != stamp:
            router = Router(path)
            self._routers[artifact], self._stamps[artifact] = router, stamp
            self._thresholds = {k: v for k, v in self._thresholds.items() if k[0] != artifact}
        return router

    def check(self, policy: RoutingPolicy, models: Collection[str],
              exact: Collection[str] | None = None,
              servable: Collection[str] | None = None) -> None:
        """Raises ValueError when the policy names unknown models (a tier's not in
        ``servable``, an opt-in not in ``models``; both by default ``models``), shadows a
        model with a router name (one of ``exact``, by default ``models``: a router's name
        wins over a pattern, never over an exact name), or points at an artifact that does
        not load."""
        for tier, names in policy.tiers.items():
            for name in names:
                if name not in (models if servable is None else servable):
                    raise ValueError(f"routing.tiers.{tier}: the model '{name}' is not "
                                     "configured on this gateway")
        for name, router in policy.routers.items():
            if name in (models if exact is None else exact):
                raise ValueError(f"routing.routers.{name}: a configured model has that name; "
                                 "opt it in with `models = [...]` instead")
            for model in router.models:
                if model not in models:
                    raise ValueError(f"routing.routers.{name}.models: the model '{model}' is "
                                     "not configured on this gateway")
            try:
                self._load(router.artifact)
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

    async def decide(self, name: str, policy: RouterPolicy, tiers: dict[str, tuple[str, ...]],
                     text: str, depth: int, embeddings: EmbeddingMemo) -> RouteDecision:
        """Route one request: ``text``, its last user message's text
        (:func:`gateway.formats.chat_text.last_user_text`); ``depth``, its user turns
        (:func:`gateway.routing.features.user_turns`). ``embeddings``: the request's
        (``ctx.embeddings``); the text's embedding is taken from it (or awaited, when the
        cache is computing it), else computed and put there (one embedding per request).
        Never raises for embedding trouble (strong tier instead)."""
        vector = await embeddings.compute(text, self._embed)
        threshold = self.threshold(policy)
        score = None if vector is None else self.router(policy.artifact).score(
            vector, text_features(text, depth))
        tier = policy.strong if score is None or score >= threshold else policy.weak
        return self._decision(name, policy, tiers, tier, score, threshold)

    def kept(self, name: str, policy: RouterPolicy, tiers: dict[str, tuple[str, ...]],
             tier: str) -> RouteDecision:
        """The decision for a conversation kept on ``tier`` (nothing scored)."""
        return self._decision(name, policy, tiers, tier, None, self.threshold(policy))

    def _decision(self, name: str, policy: RouterPolicy, tiers: dict[str, tuple[str, ...]],
                  tier: str, score: float | None, threshold: float) -> RouteDecision:
        order = [tier]
        if policy.fallback:
            order.append(policy.weak if tier == policy.strong else policy.strong)
        chain = tuple((t, model) for t in order for model in tiers[t])
        key = (name, tier)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        return RouteDecision(tier, score, threshold, chain)

    async def _embed(self, text: str) -> np.ndarray | None:
        if self.embed is None:
            return None
        try:
            async with asyncio.timeout(_EMBED_TIMEOUT_S):
                vector: np.ndarray = (await self.embed([text]))[0]
                return vector
        except Exception as exc:  # noqa: BLE001 - no embedding: route to the strong tier
            log.warning("route_embed_failed", error=type(exc).__name__)
            return None
