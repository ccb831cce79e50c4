"""Recent SSE streams, kept so that a client whose connection dropped can resume one.

Each stream the gateway sends a client (with the policy's ``[streaming] resume`` on) is a
:class:`KeptStream`: every event it sent, each stamped with its ``id:`` (0, 1, 2... in
the order sent; comments such as ``: keepalive`` get none and are not kept), whether it
has ended, and how many clients are reading it now. :class:`StreamStore` holds them per
gateway key in process memory, bounded in bytes (each key at most its share:
:class:`~gateway.tenant_lru.TenantLRU`, so one key's streams never evict another's) and
kept ``ttl_s`` after their end. A stream is found only under the key that made it: another
key's id is "not found", as an unknown one is.

SSE ids and ``Last-Event-ID``: https://html.spec.whatwg.org/multipage/server-sent-events.html
(an event's last ``id`` field sets the id a client sends back; ids are appended as each
event's last line, so an id an upstream put in its own events never wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.errors import StreamNotFound
from gateway.formats.ids import random_hex
from gateway.schema import bounded
from gateway.store_config import checked_redis_url
from gateway.tenant_lru import TenantLRU

__all__ = ["KeptStream", "Mirror", "Remote", "StreamStore", "StreamsConfig"]

#: How often (s) a live stream whose grace is over asks again whether a client reads it
#: on another replica (:meth:`Mirror.held`).
HELD_RECHECK_S = 0.5
#: The prefix of a stream's id (``x-gateway-stream-id``): 32 random hex digits follow.
STREAM_ID_PREFIX = "gws_"


@dataclass(frozen=True)
class StreamsConfig:
    """``[streams]`` of the gateway config: where resumable streams are kept (whether they
    are, and the grace before an abandoned upstream is cancelled, is the policy's
    ``[streaming]``)."""

    #: Bytes of events kept in all (memory, per replica). 64 MiB holds about 13,000
    #: answers of 1,000 tokens as OpenAI chunks (~5 KiB each).
    max_bytes: int = bounded(64 * 1024 * 1024, ge=1024)
    #: How long an ended stream stays resumable (s): a reconnect comes within seconds; 5
    #: minutes also covers a client that reads its answer again after a longer outage.
    ttl_s: int = bounded(300, ge=1)
    #: The share of max_bytes one gateway key's streams may hold (its own least recently
    #: used go beyond it). Unset: 1 / the number of keys (as ``cache.key_share``).
    key_share: float | None = bounded(None, ge=0.001, le=1.0)
    #: "memory": this replica's only; "redis": copied to Redis as they go, so a client
    #: may resume on any replica (:mod:`gateway.stream_redis`). Unset: "redis" where the
    #: response store is (``responses.store``), else memory.
    store: Literal["memory", "redis"] | None = None
    #: Unset: the response store's Redis (``responses.redis_url``), else the cache's.
    redis_url: str | None = None
    redis_url_env: str | None = None
    prefix: str = "gwstream:"

    def __post_init__(self) -> None:
        if self.redis_url is not None or self.redis_url_env is not None:
            object.__setattr__(self, "redis_url",
                               checked_redis_url(self.redis_url, self.redis_url_env))


class Mirror(Protocol):
    """A kept stream's copy elsewhere (another replica's reach): told each event block,
    the end, the response id; ``drop`` when the stream is evicted; ``held``: whether a
    client reads the copy now."""

    def add(self, events: list[bytes]) -> None: ...

    def end(self) -> None: ...

    def named(self, response_id: str) -> None: ...

    def drop(self) -> None: ...

    def held(self) -> Awaitable[bool]: ...


class Source(Protocol):
    """A stream a client can read: a :class:`KeptStream`, or a copy in Redis."""

    id: str
    api: str
    count: int

    def attach(self) -> None: ...

    def detach(self) -> None: ...

    async def read(self, at: int) -> tuple[list[bytes], bool]: ...


class Remote(Protocol):
    """Where streams are copied (:class:`~gateway.stream_redis.RedisStreams`)."""

    def mirror(self, stream: KeptStream) -> Mirror: ...

    async def find(self, tenant: str, stream_id: str) -> Source | None: ...

    async def find_response(self, tenant: str, response_id: str) -> Source | None: ...

    async def aclose(self) -> None: ...


class KeptStream:
    """One stream as its client got it. ``events``: each event sent, with its id line (the
    id is its index); ``ended``: its last byte went out (a clean end, an error event, or
    cut: see :meth:`end`); ``readers``: clients reading it now (its first client counts
    until it leaves); ``evicted``: dropped from the store for room (readers stop)."""

    __slots__ = ("_changed", "_rest", "api", "count", "ended", "events", "evicted", "id",
                 "mirror", "nbytes", "readers", "response_id", "tenant")

    def __init__(self, id_: str, tenant: str, api: str) -> None:
        self.id = id_
        self.tenant = tenant
        self.api = api
        self.events: list[bytes] = []
        self.count = 0  # events stamped (the next id; ``events`` holds them while kept)
        self.nbytes = 0
        self.ended = False
        self.evicted = False
        self.readers = 1
        #: A Responses stream's response id, once seen (``GET /v1/responses/{id}``).
        self.response_id: str | None = None
        #: Where the stream is copied for other replicas (Redis), if anywhere.
        self.mirror: Mirror | None = None
        self._rest = b""
        self._changed = asyncio.Event()

    def stamp(self, body: bytes) -> tuple[bytes, list[bytes]]:
        """``body`` (whole events, LF line ends, as the endpoint sends them) with an id line
        ending each event (the next ids), and the events so stamped, for :meth:`add`.
        Comments and blank lines pass without an id."""
        if self._rest:
            body, self._rest = self._rest + body, b""
        parts = body.split(b"\n\n")
        self._rest = parts.pop()  # b"" for whole events
        n = self.count
        out: list[bytes] = []
        new: list[bytes] = []
        for part in parts:
            if not part.strip(b"\n"):
                continue
            if part[0] == 58 and all(line[:1] == b":" for line in part.split(b"\n")):
                out.append(part + b"\n\n")  # a comment (keepalive): no event, no id
                continue
            event = b"%b\nid: %d\n\n" % (part, n + len(new))
            new.append(event)
            out.append(event)
        self.count = n + len(new)
        return b"".join(out), new

    def add(self, events: list[bytes]) -> None:
        """Keep ``events`` (stamped) and wake the readers."""
        if not self.evicted:
            self.events += events
            self.nbytes += sum(map(len, events))
            if self.mirror is not None:
                self.mirror.add(events)
        self._wake()

    def end(self, tail: bytes = b"") -> None:
        """No more events come; ``tail`` (whole events: the error event of a cut stream)
        ends it."""
        if self.ended:
            return
        if tail:
            self.add(self.stamp(tail)[1])
        self.ended = True
        if self.mirror is not None:
            self.mirror.end()
        self._wake()

    def attach(self) -> None:
        self.readers += 1
        self._wake()

    def detach(self) -> None:
        self.readers -= 1
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def changed(self) -> None:
        """Until an event is added, the stream ends or is evicted, or a reader comes or goes."""
        await self._changed.wait()

    async def read(self, at: int) -> tuple[list[bytes], bool]:
        """The events from id ``at`` on once there are any (waiting for them while the
        stream is live), and whether the stream has ended after them; raises
        :class:`~gateway.errors.StreamNotFound` once the stream is no longer kept."""
        while True:
            if self.evicted:
                raise StreamNotFound("the stream is no longer kept")
            if at < len(self.events) or self.ended:
                return self.events[at:], self.ended
            await self.changed()

    async def abandoned(self, grace_s: float) -> None:
        """Return once the live stream has had no reader for ``grace_s`` (s) on end; never
        once it has ended (its writer finishes by itself): the caller cancels its upstream."""
        loop = asyncio.get_running_loop()
        while not self.ended:
            if self.readers > 0:
                await self.changed()
                continue
            deadline = loop.time() + grace_s
            while self.readers <= 0 and not self.ended:
                left = deadline - loop.time()
                if left <= 0:
                    if self.mirror is not None and await self.mirror.held():
                        deadline = loop.time() + HELD_RECHECK_S  # read on another replica
                        continue
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self.changed()
        await asyncio.Future()  # ended: wait to be cancelled


class StreamStore:
    """The kept streams, by id, each under its gateway key (see the module docstring).
    ``clock``: seconds (``time.monotonic``)."""

    def __init__(self, config: StreamsConfig, share: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, remote: Remote | None = None
                 ) -> None:
        self.ttl_s = config.ttl_s
        #: Where streams are copied for other replicas (Redis), if anywhere.
        self.remote = remote
        self._clock = clock
        self._streams: TenantLRU[KeptStream] = TenantLRU(config.max_bytes, share)
        self._expiring: deque[tuple[float, str]] = deque()  # (expiry, id), ended ones
        self._responses: dict[tuple[str, str], str] = {}  # (tenant, response id) -> id
        #: Streams evicted for room before their expiry (metrics, tests).
        self.evicted = 0

    def open(self, tenant: str | None, api: str) -> KeptStream:
        """A new stream of ``tenant`` (a gateway key's id; None without keys) in ``api``'s
        format, its id fresh and unguessable."""
        self._expire()
        stream = KeptStream(STREAM_ID_PREFIX + random_hex(), tenant or "", api)
        if self.remote is not None:
            stream.mirror = self.remote.mirror(stream)
        self._evicted(self._streams.put(stream.tenant, stream.id, stream, 0))
        return stream

    def grew(self, stream: KeptStream) -> None:
        """``stream`` holds more bytes now: its room, and evictions for it. Its place in
        its key's order is kept: when streams grow side by side, the oldest goes first
        (a resumed one is made recent by :meth:`find`)."""
        if not stream.evicted:
            self._evicted(self._streams.resize(stream.id, stream.nbytes))

    def ended(self, stream: KeptStream) -> None:
        """``stream`` ended (once): it expires ``ttl_s`` from now."""
        self.grew(stream)
        self._expiring.append((self._clock() + self.ttl_s, stream.id))

    def named(self, stream: KeptStream, response_id: str) -> None:
        """``stream`` is the Responses stream of ``response_id``."""
        stream.response_id = response_id
        self._responses[(stream.tenant, response_id)] = stream.id
        if stream.mirror is not None:
            stream.mirror.named(response_id)

    def find(self, tenant: str | None, stream_id: str) -> KeptStream | None:
        """``tenant``'s stream ``stream_id``, or None: unknown, expired, evicted, or
        another key's (never told apart)."""
        self._expire()
        stream = self._streams.get(stream_id)
        if stream is None or stream.tenant != (tenant or ""):
            return None
        return stream

    def find_response(self, tenant: str | None, response_id: str) -> KeptStream | None:
        """``tenant``'s stream of the Responses answer ``response_id``, or None."""
        stream_id = self._responses.get((tenant or "", response_id))
        return None if stream_id is None else self.find(tenant, stream_id)

    async def lookup(self, tenant: str | None, stream_id: str) -> Source | None:
        """:meth:`find`, else the copy another replica made (Redis), else None."""
        stream = self.find(tenant, stream_id)
        if stream is None and self.remote is not None:
            return await self.remote.find(tenant or "", stream_id)
        return stream

    async def lookup_response(self, tenant: str | None, response_id: str) -> Source | None:
        """:meth:`find_response`, else another replica's copy (Redis), else None."""
        stream = self.find_response(tenant, response_id)
        if stream is None and self.remote is not None:
            return await self.remote.find_response(tenant or "", response_id)
        return stream

    async def aclose(self) -> None:
        if self.remote is not None:
            await self.remote.aclose()

    @property
    def nbytes(self) -> int:
        return self._streams.nbytes

    def _evicted(self, evicted: list[tuple[str, KeptStream]]) -> None:
        for _, gone in evicted:
            self._forget(gone)
            self.evicted += 1
            if gone.mirror is not None:  # bounded here, bounded there
                gone.mirror.drop()

    def _forget(self, stream: KeptStream) -> None:
        stream.evicted = True
        stream.events = []
        stream._wake()
        if stream.response_id is not None:
            self._responses.pop((stream.tenant, stream.response_id), None)

    def _expire(self) -> None:
        now, expiring = self._clock(), self._expiring
        while expiring and expiring[0][0] <= now:
            _, stream_id = expiring.popleft()
            stream = self._streams.pop(stream_id)
            if stream is not None:
                self._forget(stream)
