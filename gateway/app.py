"""The ASGI application: routes, the gateway's own endpoints, lifespan.

``create_app(config)`` is the composition root: it builds a :class:`~gateway.state.Gateway`
(handing it the embedder: all-MiniLM-L6-v2 from the local engine's package by default) and a
Starlette app around it. Model endpoints and pass-through are plain ASGI apps (no
request/response wrappers, no BaseHTTPMiddleware, which would hide client disconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from threadpoolctl import threadpool_limits

from gateway.config import Config
from gateway.count_tokens import CountTokensEndpoint
from gateway.embedding import Embed
from gateway.endpoint import ModelEndpoint
from gateway.errors import (
    GatewayError,
    InvalidJSON,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PermissionDenied,
)
from gateway.formats.apis import ANTHROPIC, OPENAI, RESPONSES
from gateway.http import send_error
from gateway.metrics_endpoint import MetricsApp, MetricsListener, metrics_token
from gateway.passthrough import Passthrough
from gateway.paths import BadPath, canonical_path
from gateway.requestlog import FLUSH_INTERVAL_S
from gateway.response_store.endpoints import ResponseEndpoints
from gateway.resume import ResponseStreamGet, Resumable
from gateway.state import Gateway
from gateway.stream_redis import build_stream_store
from gateway.types import ASGIApp, Receive, Scope, Send
from gateway.unserved import ROOT_BODY, refused
from gateway.upstreams.base import Upstream

__all__ = ["GatewayApp", "create_app"]

#: CPU priority (nice) of the gateway's embedding threads (see load_minilm).
EMBEDDING_NICE = 19
#: Texts per forward pass of the gateway's embedder (see _start_embedder).
EMBED_BATCH = 16


class GatewayApp:
    """The ASGI entry point, and the door: every request is routed by its canonical path
    (gateway.paths), so that each spelling of a path is the same endpoint, with the same
    stages, model table and limits (issue 45, finding 1).

    A model endpoint's exact raw path (the hot path) is dispatched by one dict lookup: such
    a path is already canonical. Any other request has its path made canonical first (a
    400 when it has no canonical form), then goes to the model endpoint it names or
    through the Starlette app (lifespan included), which sees the canonical path."""

    def __init__(self, gateway: Gateway, hot: dict[str, ASGIApp], app: Starlette):
        self.gateway = gateway
        self.starlette = app
        self._hot_paths = hot
        #: By raw path (None, a server's that gives none, is never a key).
        self._hot: dict[bytes | None, ASGIApp] = {p.encode(): h for p, h in hot.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.starlette(scope, receive, send)
            return
        if scope["method"] == "POST":
            handler = self._hot.get(scope.get("raw_path"))
            if handler is not None:
                await handler(scope, receive, send)
                return
        raw = scope.get("raw_path")
        try:
            path = canonical_path(raw.partition(b"?")[0] if raw is not None else None,
                                  scope["path"])
        except BadPath as exc:
            self.gateway.metrics.refuse("bad_path")
            await send_error(send, exc)
            return
        if path != scope["path"] or raw != path.encode():
            scope = {**scope, "path": path, "raw_path": quote(path).encode()}
        if scope["method"] == "POST":
            handler = self._hot_paths.get(path)
            if handler is not None:
                await handler(scope, receive, send)
                return
        await self.starlette(scope, receive, send)


def create_app(
    config: Config,
    *,
    request_sink: Callable[[dict[str, Any]], None] | None = None,
    upstreams: dict[str, Upstream] | None = None,
    watch_policy: bool | None = None,
    embed: Embed | None = None,
) -> GatewayApp:
    """Build the gateway app. ``request_sink`` also receives each request's log record
    (tests); ``watch_policy`` overrides ``server.policy_reload``; ``embed`` replaces the
    default embedding model (loaded in the background when the cache or a router needs it).
    """
    gw = Gateway(config, request_sink=request_sink, upstreams=upstreams, embed=embed,
                 load_embedder=None if embed is not None else load_minilm)
    watch = config.server.policy_reload if watch_policy is None else watch_policy

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        single_threaded_blas()
        await gw.start()
        if listener is not None:
            await listener.start()
        tasks = [asyncio.create_task(_flush_logs(gw))]
        if watch:
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(gw.policies.watch(ready)))
            await ready.wait()
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            gw.logger.flush()
            if listener is not None:
                await listener.aclose()
            await streams.aclose()
            await gw.aclose()

    async def models(request: Request) -> Response:
        # Router aliases ("auto"): a client may ask for them by name. A pattern entry shows
        # the ids of its `list` (a family cannot be enumerated).
        public = gw.models.public()
        names = [*public, *sorted(gw.runtime.pipeline.aliases)]
        if "anthropic-version" in request.headers:  # the anthropic SDK's models.list()
            return _json({"data": [{"type": "model", "id": name, "display_name": name,
                                    "created_at": "1970-01-01T00:00:00Z"} for name in names],
                          "has_more": False, "first_id": names[0] if names else None,
                          "last_id": names[-1] if names else None})
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "gateway"}
                for name in public]
        data += [{"id": name, "object": "model", "created": 0, "owned_by": "gateway-router"}
                 for name in sorted(gw.runtime.pipeline.aliases)]
        return _json({"object": "list", "data": data})

    async def messages_other(request: Request) -> Response:
        return refused(gw, request, NotFound(
            f"{request.method} {request.url.path[:256]} is not supported by this gateway "
            "(it serves /v1/messages and /v1/messages/count_tokens)"), "not_found")

    async def responses_other(request: Request) -> Response:
        return refused(gw, request, NotFound(  # the gateway's own: never passed through
            f"{request.method} {request.url.path[:256]} is not supported by this gateway"),
            "not_found")

    async def http_error(request: Request, exc: Exception) -> Response:
        # An unknown path or method, in the caller's API (gateway.unserved), logged.
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return refused(gw, request, NotFound(
                f"no route for {request.method} {request.url.path[:256]}"), "not_found")
        if exc.status_code == 405:
            return refused(gw, request, MethodNotAllowed(
                f"{request.method} is not allowed on {request.url.path[:256]}",
                headers=dict(exc.headers or {})), "method_not_allowed")
        return Response(str(exc.detail), exc.status_code, headers=exc.headers)

    async def root(request: Request) -> Response:
        # Clients probe the base URL (Claude Code sends HEAD to it): the gateway is there.
        return Response(ROOT_BODY, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if gw.drain.draining:
            return _json({"status": "draining", "upstreams": []}, 503)
        ready = gw.ready()
        body: dict[str, Any] = {"status": "ready" if ready else "not_ready", "upstreams": ready}
        if gw.cache is not None:  # "exact" while the embedding model is still loading
            body["cache"] = "semantic" if gw.cache.embed is not None else "exact"
        return _json(body, 200 if ready else 503)

    async def render_metrics() -> bytes:
        ready = [name for name in gw.engine_metrics.engines if gw.upstreams[name].ready]
        return gw.metrics.render() + await gw.engine_metrics.render(ready)

    metrics = MetricsApp(render_metrics, metrics_token(config))
    server = config.server
    listener = None if server.metrics_port is None else MetricsListener(
        metrics, server.metrics_host or server.host, server.metrics_port)

    async def purge(request: Request) -> Response:
        """POST /admin/cache/purge {"namespace": "..."}: drop a namespace's cache entries.
        With gateway keys configured, a key may purge only its own namespaces."""
        try:
            if gw.cache is None:
                raise InvalidRequest("the cache is not enabled", code="cache_disabled")
            key_id = gw.auth.check(request.scope["headers"])
            try:
                body = orjson.loads(await request.body())
            except orjson.JSONDecodeError as exc:
                raise InvalidJSON("the body must be JSON") from exc
            namespace = body.get("namespace") if isinstance(body, dict) else None
            if not isinstance(namespace, str) or not namespace:
                raise InvalidRequest("'namespace' must be a non-empty string",
                                     param="namespace", code="invalid_value")
            base = key_id or "default"
            if key_id is not None and namespace != base and not namespace.startswith(base + "/"):
                raise PermissionDenied(f"key '{key_id}' may purge only '{base}' and "
                                       f"'{base}/...'", param="namespace")
        except GatewayError as exc:
            return Response(exc.body(), exc.status, media_type="application/json")
        removed = await gw.cache.purge(namespace)
        return _json({"namespace": namespace, "removed": removed})

    hot: dict[str, ASGIApp] = {
        "/v1/chat/completions": ModelEndpoint(gw, "chat", "/chat/completions"),
        "/v1/completions": ModelEndpoint(gw, "completions", "/completions"),
        "/v1/embeddings": ModelEndpoint(gw, "embeddings", "/embeddings"),
        "/v1/messages": ModelEndpoint(gw, "chat", "/v1/messages", ANTHROPIC, "/v1/messages"),
        "/v1/messages/count_tokens": CountTokensEndpoint(gw),
        "/v1/responses": ModelEndpoint(gw, "chat", "/responses", RESPONSES, "/v1/responses"),
    }
    # Issue 48: the streaming endpoints' streams kept, resumable (gateway.resume).
    streams = build_stream_store(config)
    for path, api in (("/v1/chat/completions", OPENAI), ("/v1/completions", OPENAI),
                      ("/v1/messages", ANTHROPIC), ("/v1/responses", RESPONSES)):
        hot[path] = Resumable(gw, streams, hot[path], api)
    # The series the dashboard and the alert rules read, at 0 before any traffic.
    gw.metrics.start_at_zero(
        routes=hot, models=gw.models.metric_models(),
        upstreams=gw.upstreams, rate_limit_redis=gw.rate_limiter.redis is not None)
    passthrough = Passthrough(gw)
    stored = ResponseEndpoints(gw.responses, gw.auth)
    every = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    routes = [Route(path, handler, methods=["POST"]) for path, handler in hot.items()] + [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/v1", root, methods=["GET", "HEAD"]),
        Route("/v1/models", _authenticated(gw, models), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        *([Route("/metrics", metrics, methods=["GET"])] if listener is None else []),
        Route("/admin/cache/purge", purge, methods=["POST"]),
        Route("/v1/responses/{id}", ResponseStreamGet(gw, streams, stored.get),
              methods=["GET"]),
        Route("/v1/responses/{id}", stored.delete, methods=["DELETE"]),
        Route("/v1/responses/{id}/input_items", stored.input_items, methods=["GET"]),
        Route("/v1/responses/{id}/cancel", stored.cancel, methods=["POST"]),
        Route("/v1/responses/{rest:path}", responses_other, methods=every),
        Route("/v1/messages/{rest:path}", messages_other, methods=every),
        Route("/v1/{rest:path}", passthrough, methods=every),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})
    return GatewayApp(gw, hot, app)


def single_threaded_blas() -> None:
    """numpy's BLAS (OpenBLAS in numpy's wheels) on one thread in this process.

    Its matrix products here are small and run on the event loop: the cache's verifier and
    vector search, the routers, compression's ranking. A multi-threaded BLAS call waits for
    its worker threads, and on a busy CPU (the local engine's batch, the embedder) one may
    not be scheduled for a whole time slice: the event loop, and every request on it, stalls
    meanwhile. bench/flood.py on 2 cores with the engine in bf16: sheds whose lookup had
    candidates took about 100 ms (the loop stalled; shed p99 104-135 ms) with OpenBLAS's 2
    threads, none past 55 ms with one (shed p99 39.5 ms). Uses threadpoolctl."""
    threadpool_limits(1, user_api="blas")


async def load_minilm() -> tuple[Embed, Callable[[], None]]:
    """all-MiniLM-L6-v2 on its own micro-batching thread (the local engine's embedder);
    returns the embed function and the function that stops the thread.

    The embedding threads run at the lowest CPU priority (nice 19) and ONNX Runtime's do
    not spin: a semantic lookup runs alongside the request it may answer
    (``cache.lookup_budget_ms``), and on a small machine its threads would otherwise take
    the CPU from the event loop forwarding that very request (bench/semantic_cache.py, 2
    busy cores: a miss 12 ms at p50 with default threads, 5.8 ms so, 2.2 ms with the
    semantic layer off). Under CPU saturation, embeddings (the cache's, the routers') wait
    instead of the requests.
    """
    engine = await asyncio.to_thread(_in_background_thread, _start_embedder)
    return engine.embed, engine.close


def _start_embedder() -> Any:
    from local_engine.async_engine import AsyncEngine
    from local_engine.embedder import Embedder

    embedder = Embedder.load(spin=False)  # ORT's thread pool inherits this thread's nice
    # and so does the engine thread. Passes of 16 texts (on a CPU batching buys little):
    # between two, lookups of requests shed meanwhile are dropped (a flood's opening burst
    # queues one per request).
    return AsyncEngine(None, embedder, max_embed_batch=EMBED_BATCH).start()


def _in_background_thread(work: Callable[[], Any]) -> Any:
    """``work()`` on a new thread at nice 19; its errors are raised here. A pool of its own,
    not the default executor, whose worker would keep the priority for later jobs."""
    with ThreadPoolExecutor(1, "embedder-load", initializer=_lower_priority) as pool:
        return pool.submit(work).result()


def _lower_priority() -> None:
    """This thread at nice 19 (Linux: threads it starts inherit it; a no-op where
    priorities are not per thread)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), EMBEDDING_NICE)


async def _flush_logs(gw: Gateway) -> None:
    while True:
        await asyncio.sleep(FLUSH_INTERVAL_S)
        gw.logger.flush()


def _authenticated(gw: Gateway, endpoint: Callable[[Request], Awaitable[Response]]
                   ) -> Callable[[Request], Awaitable[Response]]:
    async def guarded(request: Request) -> Response:
        try:
            gw.auth.check(request.scope["headers"])
        except GatewayError as exc:
            return Response(exc.body(), exc.status, media_type="application/json")
        return await endpoint(request)

    return guarded


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json")

