"""An upstream served by several replicas: ``replicas = [...]`` (base URLs) or ``discover``
(a URL whose host name resolves to one A/AAAA record per replica, e.g. a Kubernetes
headless Service, resolved again every ``pool.discover_interval_s``).

:class:`ReplicaPool` is one :class:`~gateway.upstreams.base.Upstream` to the rest of the
gateway (dispatch, admission and the breaker see one upstream); inside, each request goes to
the replica its routing policy (:mod:`gateway.replicas.routing`) puts first. A replica that
refuses or drops the connection (nothing reached the client) is marked and the request goes
to the next one at once, so a replica dying loses no request that has not started
answering; a whole answer that breaks off is sent again the same way. A stream already
answering when its replica dies ends with an error event (the gateway cannot resume another
engine's generation).

Health (Envoy's outlier detection, :mod:`gateway.replicas.health`): connection failures,
5xx answers and failed ``/healthz`` reads count against a replica; enough in a row eject it
for a while; back, it ramps up. ``/healthz`` is read every ``health_interval_s``: our
engine's reports its running and waiting sequences (the load the policies weigh when several
gateways share the replicas), its KV blocks (the approximate index's bound) and its
capacity: the pool's is the sum over the replicas taking requests, which admission follows
(gateway.concurrency.AdmissionPolicy.for_capacity). With
``routing = "prefix_precise"``, each replica's ``/kv_events`` is read every
``events_interval_s``: the block hashes it stored and evicted (local_engine.kv_events).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
import structlog

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable
from gateway.replicas.health import Outlier
from gateway.replicas.prefix import byte_keys, render
from gateway.replicas.routing import Replica, make_router
from gateway.replicas.watch import Member, read_events, read_health
from gateway.service_time import ServiceRates
from gateway.tracing import note_replica
from gateway.upstreams.base import (
    RawHeaders,
    Upstream,
    UpstreamRequest,
    UpstreamResponse,
    WholeResponse,
)
from gateway.upstreams.openai import OpenAIUpstream

__all__ = ["ReplicaPool"]

log = structlog.get_logger("gateway.replicas")


class _Tracked(UpstreamResponse):
    """A replica's response; closing it ends the request's count on that replica."""

    __slots__ = ("_inner", "_state", "headers", "status")

    def __init__(self, inner: UpstreamResponse, state: Replica) -> None:
        self._inner = inner
        self._state: Replica | None = state
        self.status, self.headers = inner.status, inner.headers

    def iter_chunks(self, idle_s: float = 0.0) -> AsyncIterator[bytes]:
        return self._inner.iter_chunks(idle_s)

    def watch_idle(self, idle_s: float, on_stall: Callable[[], None]) -> None:
        self._inner.watch_idle(idle_s, on_stall)

    async def read(self) -> bytes:
        return await self._inner.read()

    def at_eof(self) -> bool:
        return self._inner.at_eof()

    def close(self) -> None:
        self._inner.close()
        if self._state is not None:
            self._state.in_flight -= 1
            self._state = None


class ReplicaPool(Upstream):
    api = "openai"

    def __init__(self, name: str, config: UpstreamConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.config, self.pool = name, config, config.pool
        self.clock = clock
        p = self.pool
        self.router = make_router(p.routing, p.cache_threshold, p.balance_abs_threshold,
                                  p.balance_rel_threshold, p.pending_s, clock)
        self.members: dict[str, Member] = {}
        self._retired: list[Member] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        #: gateway.replicas.tokens.EngineKeys, loaded by start() for prefix_precise.
        self.engine_keys: Any = None
        self.block_size = 16  # the engines' KV block (tokens), as /kv_events says
        self.cancel_on_late_hit = bool(config.cancel_on_late_hit)
        self._capacity_changed: list[Callable[[int | None, ServiceRates | None], None]] = []
        for url in config.replicas:
            self._add(url)

    @property
    def ready(self) -> bool:
        """Some replica is not ejected."""
        now = self.clock()
        return any(m.outlier.available(now) for m in self.members.values())

    # -- membership ------------------------------------------------------------------------
    def _add(self, url: str) -> None:
        p = self.pool
        capacity = int(p.kv_tokens * p.bytes_per_token) // p.block_bytes
        # named as the pool: a client's error message names no internal address
        upstream = OpenAIUpstream(self.name, dataclasses.replace(
            self.config, base_url=url, replicas=(), discover=""))
        self.members[url] = Member(url, Replica(url, capacity), upstream, Outlier(p.outlier))

    def _set_members(self, urls: list[str]) -> None:
        for url in urls:
            if url not in self.members:
                self._add(url)
                log.info("replica_added", upstream=self.name, replica=url)
        for url in [u for u in self.members if u not in urls]:
            self._retired.append(self.members.pop(url))
            log.info("replica_removed", upstream=self.name, replica=url)

    async def _discover(self) -> list[str]:
        """One URL per address the ``discover`` host resolves to now."""
        parts = urlsplit(self.config.discover)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = await asyncio.get_running_loop().getaddrinfo(
            parts.hostname, port, type=socket.SOCK_STREAM)
        hosts = sorted({str(info[4][0]) for info in infos})
        return [urlunsplit((parts.scheme, f"[{h}]:{port}" if ":" in h else f"{h}:{port}",
                            parts.path, "", "")) for h in hosts]

    async def start(self) -> None:
        """Discover the replicas (when asked), load the tokenizer (prefix_precise), and
        start watching the replicas' health (and KV events)."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        if self.config.discover:
            with contextlib.suppress(OSError):
                self._set_members(await self._discover())
            self._tasks.append(asyncio.create_task(self._every(
                self.pool.discover_interval_s, self._rediscover)))
        if self.router.keys == "tokens":
            from gateway.replicas.tokens import EngineKeys

            self.engine_keys = await asyncio.to_thread(EngineKeys, self.pool.tokenizer)
            self._tasks.append(asyncio.create_task(self._every(
                self.pool.events_interval_s, self._read_events)))
        self._tasks.append(asyncio.create_task(self._every(
            self.pool.health_interval_s, self._check_health)))

    async def _rediscover(self) -> None:
        try:
            urls = await self._discover()
        except OSError as exc:  # keep the replicas known: DNS may be down a moment
            log.warning("replica_discovery_failed", upstream=self.name, error=str(exc))
            return
        if urls:
            self._set_members(urls)

    async def _every(self, interval_s: float, job: Callable[[], Any]) -> None:
        while True:
            await job()
            await asyncio.sleep(interval_s)

    # -- watching --------------------------------------------------------------------------
    async def _check_health(self) -> None:
        assert self._session is not None
        members = list(self.members.values())
        healthy = await asyncio.gather(*(read_health(self._session, m, self.pool)
                                         for m in members))
        for member, ok in zip(members, healthy, strict=True):
            if ok:
                member.outlier.succeeded()
            else:
                self._failed(member)
        now = self.clock()
        known = [m.capacity for m in members if m.capacity and m.outlier.available(now)]
        capacity = sum(known) if known else None
        if capacity != self.capacity:  # admission follows the replicas taking requests
            self.capacity = capacity
            for changed in self._capacity_changed:
                changed(capacity, None)

    def on_capacity(self, changed: Callable[[int | None, ServiceRates | None], None]) -> None:
        self._capacity_changed.append(changed)

    async def _read_events(self) -> None:
        assert self._session is not None
        sizes = await asyncio.gather(*(read_events(self._session, m)
                                       for m in list(self.members.values())))
        self.block_size = next((size for size in sizes if size), self.block_size)

    # -- requests ---------------------------------------------------------------------------
    def _failed(self, member: Member) -> None:
        now = self.clock()
        members = self.members.values()
        ejected = sum(1 for m in members if not m.outlier.available(now))
        allowed = max(1, len(self.members) * self.pool.outlier.max_ejection_percent // 100)
        if member.outlier.failed(now, ejected < allowed):
            log.warning("replica_ejected", upstream=self.name, replica=member.url,
                        ejections=member.outlier.ejections)

    def _order(self, keys: list[int]) -> list[Member]:
        now = self.clock()
        members = [m for m in self.members.values() if m.outlier.available(now)]
        if not members:  # all ejected: Envoy's panic mode, every replica is tried
            members = list(self.members.values())
        if not members:
            return []
        for m in members:
            m.state.weight = m.outlier.weight(now)
        return [self.members[s.name] for s in self.router.order([m.state for m in members],
                                                                  keys)]

    async def _keys(self, request: UpstreamRequest) -> list[int]:
        kind = self.router.keys
        if kind is None or not request.path.endswith("/chat/completions"):
            return []
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(body, dict):
            return []
        if kind == "bytes":
            return byte_keys(render(body), self.pool.block_bytes)
        if self.engine_keys is None:
            return []
        return await asyncio.to_thread(self.engine_keys.keys, body, self.block_size)

    async def _open(self, request: UpstreamRequest, skip: set[str]
                    ) -> tuple[UpstreamResponse, Member]:
        """The first replica in the policy's order that answers with a status line."""
        error: UpstreamError | None = None
        for member in self._order(await self._keys(request)):
            if member.url in skip:
                continue
            state = member.state
            state.in_flight += 1
            try:
                response = await member.upstream.stream(request)
            except UpstreamUnreachable as exc:
                state.in_flight -= 1
                self._failed(member)
                skip.add(member.url)
                error = exc
                log.warning("replica_unreachable", upstream=self.name, replica=member.url,
                            request_id=request.request_id)
                continue
            except BaseException:
                state.in_flight -= 1
                raise
            if response.status >= 500:
                self._failed(member)
            else:
                member.outlier.succeeded()
            note_replica(member.url, self.router.why if not skip else "next_after_unreachable")
            return _Tracked(response, state), member
        raise error or UpstreamUnreachable(f"upstream {self.name!r} has no replica")

    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        response, _ = await self._open(request, set())
        return response

    async def send(self, request: UpstreamRequest) -> WholeResponse:
        """As :meth:`stream`, read whole; an answer that breaks off is sent to the next
        replica (nothing has reached the client)."""
        skip: set[str] = set()
        while True:
            response, member = await self._open(request, skip)
            try:
                body = await response.read()
            except UpstreamTimeout:
                raise
            except UpstreamError:
                self._failed(member)
                skip.add(member.url)
                if len(skip) >= len(self.members):
                    raise
                continue
            finally:
                response.close()
            headers: RawHeaders = response.headers
            return WholeResponse(response.status, headers, body)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for member in [*self.members.values(), *self._retired]:
            await member.upstream.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None
