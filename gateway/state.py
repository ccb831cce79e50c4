"""The gateway's runtime objects, built from a :class:`~gateway.config.Config`.

One :class:`Gateway` per app: no module-level state. Built by the app factory, closed by the
app's lifespan.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.auth import Authenticator
from gateway.breaker import State
from gateway.cache.backend import Backend, MemoryBackend
from gateway.cache.stage import Embed, ResponseCache
from gateway.cache.verifier import ARTIFACT, Verifier
from gateway.config import CacheConfig, Config, Target, UpstreamConfig
from gateway.degraded import EntryLimits
from gateway.dispatch import Dispatcher
from gateway.errors import ModelNotFound
from gateway.metrics import Metrics
from gateway.policy import Policy, PolicyStore
from gateway.requestlog import RequestIds, RequestLogger
from gateway.routing.stage import RoutingStage
from gateway.upstreams.base import Upstream
from gateway.upstreams.openai import OpenAIUpstream

__all__ = ["Gateway", "ModelRoute", "ModelTable", "build_cache", "build_upstream"]


@dataclass(frozen=True, slots=True)
class ModelRoute:
    name: str
    targets: tuple[Target, ...]


class ModelTable:
    """Public model names and aliases -> the model's ordered targets."""

    def __init__(self, config: Config):
        self.routes: dict[str, ModelRoute] = {}
        self.names: list[str] = []
        for name, model in config.models.items():
            route = ModelRoute(name, model.targets)
            self.names.append(name)
            for public in (name, *model.aliases):
                self.routes[public] = route

    def resolve(self, name: str) -> ModelRoute:
        route = self.routes.get(name)
        if route is None:
            raise ModelNotFound(f"the model '{name}' does not exist on this gateway; "
                                "GET /v1/models lists the available models", param="model")
        return route


def build_cache(config: CacheConfig, embed: Embed | None) -> ResponseCache:
    """The response cache on its configured backend, with the shipped verifier."""
    backend: Backend
    if config.backend == "redis":
        from gateway.cache.redis_backend import RedisBackend

        backend = RedisBackend(config.redis_url, prefix=config.prefix)
    else:
        backend = MemoryBackend(config.max_entries, config.max_bytes)
    verifier = Verifier() if ARTIFACT.exists() else None
    return ResponseCache(backend, embed, verifier)


def build_upstream(name: str, config: UpstreamConfig) -> Upstream:
    """The provider for ``config.type`` (the config schema lists the types that exist)."""
    if config.type == "local":
        from gateway.upstreams.local import LocalUpstream

        return LocalUpstream(name, config)
    return OpenAIUpstream(name, config)


class Gateway:
    def __init__(
        self,
        config: Config,
        *,
        request_sink: Callable[[dict[str, Any]], None] | None = None,
        upstreams: dict[str, Upstream] | None = None,
        embed: Embed | None = None,
    ):
        self.config = config
        self.metrics = Metrics()
        self.models = ModelTable(config)
        self.routing = RoutingStage(embed)
        self.metrics.watch_routing(self.routing)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.policies = PolicyStore(config.policy_path, on_reload=self._policy_reloaded,
                                    check=self._check_policy)
        self.auth = Authenticator(config.auth, source=config.path)
        self.upstreams = upstreams if upstreams is not None else {
            name: build_upstream(name, up) for name, up in config.upstreams.items()
        }
        self.dispatcher = Dispatcher(self.upstreams, self.policies.current)
        self.limits = EntryLimits()
        self.metrics.watch_guards(self.dispatcher)
        self.logger = RequestLogger(request_sink, enabled=config.logging.requests)
        self.request_ids = RequestIds()
        self.cache = build_cache(config.cache, embed) if config.cache.enabled else None
        if self.cache is not None:
            self.metrics.watch_cache(self.cache)
        self._embedder: Any = None
        self._loading: asyncio.Task[None] | None = None

    @property
    def policy(self) -> Policy:
        return self.policies.current

    def _check_policy(self, policy: Policy) -> None:
        self.routing.check(policy.routing, self.models.routes.keys())

    def _policy_reloaded(self, ok: bool) -> None:
        """Runs on the reloading thread."""
        self.metrics.policy_reloads.labels("ok" if ok else "rejected").inc()
        if ok:
            self.dispatcher.update(self.policies.current)
            if self._loop is not None and self._wants_embedder():
                self._loop.call_soon_threadsafe(self._start_embedder)

    def _wants_embedder(self) -> bool:
        """The semantic cache or a router needs embeddings and none were given."""
        cache = self.cache is not None and self.cache.embed is None \
            and self.config.cache.semantic
        routing = self.routing.embed is None and bool(self.policy.routing.routers)
        return cache or routing

    def _start_embedder(self) -> None:
        if self._loading is None and self._embedder is None:
            self._loading = asyncio.create_task(self._load_embedder())

    def ready(self) -> list[str]:
        """Upstreams that can take traffic now: enabled, and their breaker not open."""
        return [name for name, u in self.upstreams.items()
                if u.enabled and u.ready
                and self.dispatcher.guards[name].breaker.state is not State.OPEN]

    def passthrough_upstream(self) -> Upstream | None:
        """Where /v1/* paths the gateway does not interpret go: the first enabled upstream."""
        for upstream in self.upstreams.values():
            if upstream.enabled:
                return upstream
        return None

    async def start(self) -> None:
        for upstream in self.upstreams.values():
            if upstream.enabled:
                await upstream.start()
        self._loop = asyncio.get_running_loop()
        if self._wants_embedder():
            # The embedding model loads in the background: until it is ready, the cache
            # serves exact matches only and routers send requests to their strong tier.
            self._start_embedder()

    async def _load_embedder(self) -> None:
        from local_engine.async_engine import AsyncEngine
        from local_engine.embedder import Embedder

        embedder = await asyncio.to_thread(Embedder.load)
        self._embedder = AsyncEngine(None, embedder).start()
        if self.cache is not None and self.config.cache.semantic and self.cache.embed is None:
            self.cache.embed = self._embedder.embed
        if self.routing.embed is None:
            self.routing.embed = self._embedder.embed

    async def aclose(self) -> None:
        if self._loading is not None:
            self._loading.cancel()
        if self.cache is not None:
            await self.cache.aclose()
        if self._embedder is not None:
            self._embedder.close()
        for upstream in self.upstreams.values():
            await upstream.aclose()
