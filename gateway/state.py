"""The gateway's runtime objects, built from a :class:`~gateway.config.Config`.

One :class:`Gateway` per app: no module-level state. Built by the app factory (the
composition root, which also hands in the embedder), closed by the app's lifespan. What a
request reads of the policy is one :class:`Runtime`: the policy and the pipeline built from
it, replaced whole on reload (on the event loop), so a request in flight finishes on the
snapshot it started with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.auth import Authenticator
from gateway.breaker import State
from gateway.cache.backend import Backend, MemoryBackend
from gateway.cache.cache import ResponseCache
from gateway.cache.policy_verifier import PolicyVerifier, VerifierKind
from gateway.coalesce.flight import Flights
from gateway.compression.state import CompressionState
from gateway.config import CacheConfig, Config, UpstreamConfig
from gateway.dispatch import Dispatch, Dispatcher
from gateway.drain import Drain
from gateway.embedding import Embed, LoadEmbedder
from gateway.engine_metrics import EngineScraper
from gateway.entry_limits import EntryLimits, ModelLimiters
from gateway.metrics import Metrics
from gateway.models import ModelTable
from gateway.pipeline import Pipeline
from gateway.policy import Policy, PolicyStore
from gateway.prompt_cache.cache_keys import CacheKeys
from gateway.prompt_cache.memory import PromptMemory
from gateway.ratelimit.limiter import RateLimiter
from gateway.requestlog import RequestIds, RequestLogger
from gateway.response_store.records import MemoryRecords, Records, RedisRecords
from gateway.response_store.store import ResponseStore
from gateway.routing.decision import Routers
from gateway.secret import load_secret
from gateway.stage_table import Services, check_stages
from gateway.store_config import key_share
from gateway.stream_watch import StreamWatchCollector
from gateway.tracing import Tracing
from gateway.upstreams.base import Upstream
from gateway.upstreams.openai import OpenAIUpstream
from llm_wire.asgi import DisconnectWatches

__all__ = ["Gateway", "Runtime", "build_cache", "build_response_records", "build_upstream",
           "check_policy"]


def check_policy(policy: Policy, models: ModelTable, routers: Routers) -> None:
    """What a policy names must exist on this gateway: its stages (the stage table), the
    models its tiers and rate limits name, the routers' artifacts. Raises ValueError naming
    the key; run on every policy loaded (start-up, live reload) and by ``gateway check``.
    A model may be named exactly, by a pattern as written, or by an id a pattern matches."""
    check_stages(policy.pipeline.stages)
    routers.check(policy.routing, models.known(), models.routes.keys(),
                  models.known(patterns=False))
    policy.rate_limits.check_models(models.known(policy.routing.routers))


def build_cache(config: CacheConfig, embed: Embed | None,
                kind: Callable[[], VerifierKind] = lambda: "mlp", keys: int = 1
                ) -> ResponseCache:
    """The response cache on its configured backend, scoring with the shipped verifier that
    ``kind()`` (the current policy's ``[cache] verifier``) names; ``keys``: how many gateway
    keys share it (their share of the memory backend, :func:`~gateway.store_config.key_share`)."""
    backend: Backend
    if config.backend == "redis":
        from gateway.cache.redis_backend import RedisBackend

        backend = RedisBackend(config.redis_url, prefix=config.prefix)
    else:
        backend = MemoryBackend(config.max_entries, config.max_bytes,
                                share=key_share(config.key_share, keys))
    return ResponseCache(backend, embed, PolicyVerifier(kind))


def build_response_records(config: Config) -> Records:
    """Where /v1/responses keeps responses: ``[responses] store``, by default the cache's
    Redis when the cache lives in Redis, else in memory."""
    settings, cache = config.responses, config.cache
    redis_cache = cache.enabled and cache.backend == "redis"
    store = settings.store or ("redis" if redis_cache or settings.redis_url else "memory")
    if store == "redis":
        url = settings.redis_url or cache.redis_url
        return RedisRecords(url, settings.prefix)
    return MemoryRecords(settings.max_bytes,
                         share=key_share(settings.key_share, len(config.auth.keys)))


def build_upstream(name: str, config: UpstreamConfig) -> Upstream:
    """The provider for ``config.type`` (the config schema lists the types that exist)."""
    if config.type == "local":
        from gateway.upstreams.local import LocalUpstream

        return LocalUpstream(name, config)
    if config.replicas or config.discover:
        from gateway.replicas.pool import ReplicaPool

        return ReplicaPool(name, config)
    if config.type == "anthropic":
        from gateway.upstreams.anthropic import AnthropicUpstream

        return AnthropicUpstream(name, config)
    if config.type == "azure_openai":
        from gateway.upstreams.azure import AzureOpenAIUpstream

        return AzureOpenAIUpstream(name, config)
    if config.type == "bedrock":
        from gateway.upstreams.bedrock import BedrockUpstream

        return BedrockUpstream(name, config)
    if config.type in ("gemini", "vertex"):
        from gateway.upstreams.google import GeminiUpstream, VertexUpstream

        return (GeminiUpstream if config.type == "gemini" else VertexUpstream)(name, config)
    return OpenAIUpstream(name, config)


@dataclass(frozen=True, slots=True)
class Runtime:
    """What one request reads of the policy: the snapshot and its pipeline."""

    policy: Policy
    pipeline: Pipeline


class Gateway:
    def __init__(
        self,
        config: Config,
        *,
        request_sink: Callable[[dict[str, Any]], None] | None = None,
        upstreams: dict[str, Upstream] | None = None,
        embed: Embed | None = None,
        load_embedder: LoadEmbedder | None = None,
    ):
        self.config = config
        self.metrics = Metrics()
        self.models = ModelTable(config)
        self.routers = Routers(embed)
        self.policies = PolicyStore(config.policy_path, on_reload=self._policy_reloaded,
                                    check=self._check_policy)
        self.metrics.watch_routing(self.routers, lambda: self.policies.current.routing)
        self.auth = Authenticator(config.auth, source=config.path)
        self.upstreams = upstreams if upstreams is not None else {
            name: build_upstream(name, up) for name, up in config.upstreams.items()
        }
        policy = self.policies.current
        self.dispatcher = Dispatcher(self.upstreams, policy)
        self.entry_limits = EntryLimits(len(config.auth.keys))
        self.model_limiters = ModelLimiters()
        self.metrics.watch_guards(self.dispatcher)
        self.metrics.registry.register(StreamWatchCollector(self.dispatcher.watch,
                                                            self.upstreams))
        self.logger = RequestLogger(request_sink, enabled=config.logging.requests)
        #: OpenTelemetry traces (gateway.tracing): None when off, as by default.
        self.tracing = _tracing(config, self.metrics, self.upstreams)
        self.request_ids = RequestIds()
        self.cache = build_cache(config.cache, embed, lambda: self.policy.cache.verifier,
                                 len(config.auth.keys)) if config.cache.enabled else None
        if self.cache is not None:
            self.metrics.watch_cache(self.cache)
        #: The prompt_cache stage's memory of recent requests (kept across policy reloads).
        self.prompt_memory = PromptMemory()
        #: OpenAI prompt_cache_key values under the deployment's secret: a client's own is
        #: namespaced by its key at the door (gateway.endpoint), the stage derives the rest.
        self.cache_keys = CacheKeys(load_secret(config.secret, config.path))
        #: The rate_limit stage's buckets and Redis client (kept across policy reloads).
        self.rate_limiter = RateLimiter.from_config(config)
        #: Graceful shutdown (SIGTERM): see gateway.drain.
        self.drain = Drain()
        #: The event loop it serves on, once started (None before: found when needed).
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Client-disconnect watchers of the model endpoints' requests (one shared timer).
        self.watches = DisconnectWatches()
        #: The local engines' /metrics, served on the gateway's (one scrape target).
        from gateway.upstreams.local import LocalUpstream

        self.engine_metrics = EngineScraper({
            name: f"http://127.0.0.1:{u.port}/metrics" for name, u in self.upstreams.items()
            if isinstance(u, LocalUpstream)})
        self.metrics.registry.register(self.engine_metrics.collector())
        from gateway.replicas.pool import ReplicaPool

        pools = [u for u in self.upstreams.values() if isinstance(u, ReplicaPool)]
        if pools:  # their replicas' state, read at scrape time
            from gateway.replicas.metrics import PoolCollector

            self.metrics.registry.register(PoolCollector(pools))
        #: /v1/responses' stored responses (previous_response_id, GET by id).
        self.responses = ResponseStore(build_response_records(config), config.responses.ttl_s,
                                       self.upstreams)
        #: The coalesce stage's calls in flight (kept across reloads).
        self.flights = Flights()
        self.metrics.registry.register(self.flights.collector())
        #: The compress stage's learned rates and token counters (kept across reloads).
        self.compression = CompressionState(embed)
        self.services = Services(
            metrics=self.metrics, models=self.models, upstreams=self.upstreams,
            cache=self.cache, routers=self.routers, compression=self.compression,
            prompt_memory=self.prompt_memory, cache_keys=self.cache_keys,
            rate_limiter=self.rate_limiter,
            entry_limits=self.entry_limits, model_limiters=self.model_limiters,
            flights=self.flights, traced=self.tracing is not None)
        self._terminal = Dispatch(self.dispatcher)
        self.runtime = Runtime(policy, Pipeline(policy, self.services, self._terminal))
        self._load_embedder = load_embedder
        self._stop_embedder: Callable[[], None] | None = None
        self._loading: asyncio.Task[None] | None = None

    @property
    def policy(self) -> Policy:
        """The current policy (a request uses the snapshot in its context instead)."""
        return self.runtime.policy

    def _check_policy(self, policy: Policy) -> None:
        check_policy(policy, self.models, self.routers)

    def _policy_reloaded(self, ok: bool) -> None:
        """After each reload attempt, on the event loop: swap the runtime and follow the new
        limits."""
        self.metrics.policy_reloads.labels("ok" if ok else "rejected").inc()
        policy = self.policies.current
        if not ok or policy is self.runtime.policy:
            return
        self.runtime = Runtime(policy, Pipeline(policy, self.services, self._terminal))
        self.dispatcher.update(policy)
        self.model_limiters.update(policy.admission)
        if self._wants_embedder():
            self._start_embedder()

    def _wants_embedder(self) -> bool:
        """The semantic cache, a router or compression needs embeddings and none were
        given."""
        cache = self.cache is not None and self.cache.embed is None \
            and self.config.cache.semantic
        routing = self.routers.embed is None and bool(self.policy.routing.routers)
        compression = self.compression.embed is None and self.policy.compression.enabled
        return self._load_embedder is not None and (cache or routing or compression)

    def _start_embedder(self) -> None:
        if self._loading is None and self._stop_embedder is None:
            self._loading = asyncio.create_task(self._start_loading())

    def ready(self) -> list[str]:
        """Upstreams that can take traffic now: enabled, and their breaker not open."""
        return [name for name, u in self.upstreams.items()
                if u.enabled and u.ready
                and self.dispatcher.guards[name].breaker.state is not State.OPEN]

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.drain.attach(self.loop)
        for upstream in self.upstreams.values():
            if upstream.enabled:
                await upstream.start()
        if self._wants_embedder():
            # The embedding model loads in the background: until it is ready, the cache
            # serves exact matches only and routers send requests to their strong tier.
            self._start_embedder()

    async def _start_loading(self) -> None:
        assert self._load_embedder is not None
        embed, self._stop_embedder = await self._load_embedder()
        if self.cache is not None and self.config.cache.semantic and self.cache.embed is None:
            self.cache.embed = embed
        if self.routers.embed is None:
            self.routers.embed = embed
        if self.compression.embed is None:
            self.compression.embed = embed

    async def aclose(self) -> None:
        if self._loading is not None:
            self._loading.cancel()
        if self.cache is not None:
            await self.cache.aclose()
        if self._stop_embedder is not None:
            self._stop_embedder()
        await self.engine_metrics.aclose()
        await self.rate_limiter.aclose()
        await self.responses.aclose()
        for upstream in self.upstreams.values():
            await upstream.aclose()
        if self.tracing is not None:  # what is queued goes out (the export timeout at most)
            await asyncio.to_thread(self.tracing.shutdown)


def _tracing(config: Config, metrics: Metrics, upstreams: dict[str, Upstream]) -> Tracing | None:
    """The tracer when ``[tracing]`` is on (its span counts on /metrics; the local engines
    it starts trace too), else None: nothing of OpenTelemetry imported."""
    if not config.tracing.on:
        return None
    from gateway.upstreams.local import LocalUpstream

    tracing = Tracing(config.tracing)
    metrics.registry.register(tracing.counts.collector())
    for upstream in upstreams.values():
        if isinstance(upstream, LocalUpstream):
            upstream.trace_env = tracing.engine_env()
    return tracing
