"""Kept streams copied to Redis, so that a client may resume on any replica.

The replica serving a stream keeps it in memory (:mod:`gateway.stream_store`) and copies
it to Redis as it goes, off the client's path: one writer task per stream sends what came
since its last write in one ``MULTI`` (``RPUSH`` of the stamped events, the stream's
fields, ``EXPIRE``), so a reader never sees the end before the last events. Keys, under
``prefix``: ``<id>`` the events (a list, index = id), ``<id>:m`` a hash (``tenant``,
``api``, ``ended``), ``<id>:r`` "a client reads it on another replica" (expires 2 s after
that reader's last poll: the serving replica does not cancel the upstream meanwhile),
``r:<tenant>:<response id>`` a Responses stream's id. Everything expires ``ttl_s`` after
its last write. A replica that does not hold a stream reads the copy, polling every
:data:`POLL_S` for more while it is live. The bounds in Redis are its own (``maxmemory``),
as for the response store; a stream evicted from memory for room is deleted here too.
A Redis that fails is logged once per outage; the stream goes on, kept in memory only.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from gateway.config import Config
from gateway.errors import StreamNotFound
from gateway.response_store.records import REDIS_TIMEOUT_MS, StoreUnavailable
from gateway.store_config import key_share
from gateway.stream_store import KeptStream, Source, StreamStore

__all__ = ["POLL_S", "RedisStreams", "build_stream_store"]

log = structlog.get_logger("gateway.stream_redis")

#: How often (s) a reader of another replica's live stream asks Redis for more.
POLL_S = 0.05
#: A remote reader's mark lives this long (ms) past its last poll.
READER_MS = 2_000


def build_stream_store(config: Config) -> StreamStore:
    """The kept streams: in memory, copied to Redis where ``[streams] store`` says so (by
    default, where the response store lives in Redis: ``responses.store``, or the cache's
    Redis)."""
    streams, responses, cache = config.streams, config.responses, config.cache
    responses_redis = responses.store == "redis" or responses.store is None and bool(
        (cache.enabled and cache.backend == "redis") or responses.redis_url)
    remote = None
    if (streams.store or ("redis" if responses_redis or streams.redis_url else "memory")
            ) == "redis":
        remote = RedisStreams(streams.redis_url or responses.redis_url or cache.redis_url,
                              streams.prefix, streams.ttl_s)
    return StreamStore(streams, key_share(streams.key_share, len(config.auth.keys)),
                       remote=remote)


class RedisStreams:
    """The Redis at ``url`` (keys under ``prefix``, expiring ``ttl_s`` s after their last
    write): :class:`~gateway.stream_store.Remote` for a :class:`StreamStore`."""

    def __init__(self, url: str, prefix: str, ttl_s: int) -> None:
        import redis.asyncio

        self.redis = redis.asyncio.Redis.from_url(url)
        self.prefix, self.ttl_s = prefix, ttl_s
        self.down = False  # logged once per outage

    def mirror(self, stream: KeptStream) -> _Copy:
        return _Copy(self, stream)

    async def find(self, tenant: str, stream_id: str) -> Source | None:
        key = self.prefix + stream_id
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(key + ":m")
        pipe.llen(key)
        meta, count = await self.call(pipe.execute())
        if not meta or meta.get(b"tenant", b"").decode() != tenant:
            return None
        return _Remote(self, stream_id, meta.get(b"api", b"").decode(), int(count))

    async def find_response(self, tenant: str, response_id: str) -> Source | None:
        stream_id = await self.call(self.redis.get(f"{self.prefix}r:{tenant}:{response_id}"))
        return None if stream_id is None else await self.find(tenant, stream_id.decode())

    async def call(self, call: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            async with asyncio.timeout(REDIS_TIMEOUT_MS / 1000):
                return await call
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable("the stream store (Redis) is not answering; try again "
                                   "shortly") from exc

    async def aclose(self) -> None:
        await self.redis.aclose()


class _Copy:
    """One stream's copy: its writer task sends what came since its last write."""

    def __init__(self, owner: RedisStreams, stream: KeptStream) -> None:
        self.owner, self.stream = owner, stream
        self.pending: list[bytes] = []
        self.ended = False
        self.response_id: str | None = None
        self._wake = asyncio.Event()
        self._wake.set()  # its fields at once: resumable elsewhere before its first event
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            self._write())

    def add(self, events: list[bytes]) -> None:
        self.pending += events
        self._wake.set()

    def end(self) -> None:
        self.ended = True
        self._wake.set()

    def named(self, response_id: str) -> None:
        self.response_id = response_id
        self._wake.set()

    def drop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._task = asyncio.get_running_loop().create_task(self._delete())

    async def held(self) -> bool:
        with contextlib.suppress(StoreUnavailable):
            return bool(await self.owner.call(self.owner.redis.exists(self._key + ":r")))
        return False

    @property
    def _key(self) -> str:
        return self.owner.prefix + self.stream.id

    async def _write(self) -> None:
        owner, stream, key = self.owner, self.stream, self._key
        fields: dict[Any, Any] = {"tenant": stream.tenant, "api": stream.api}
        while True:
            await self._wake.wait()
            self._wake.clear()
            events, self.pending = self.pending, []
            ended, response_id = self.ended, self.response_id
            pipe = owner.redis.pipeline(transaction=True)
            if events:
                pipe.rpush(key, *events)
            if response_id is not None:
                pipe.set(f"{owner.prefix}r:{stream.tenant}:{response_id}", stream.id,
                         ex=owner.ttl_s)
                self.response_id = None
            if ended:
                fields["ended"] = "1"
            pipe.hset(key + ":m", mapping=fields)
            pipe.expire(key, owner.ttl_s)
            pipe.expire(key + ":m", owner.ttl_s)
            try:
                await owner.call(pipe.execute())
                if owner.down:
                    owner.down = False
                    log.info("stream_redis_restored")
            except StoreUnavailable:
                if not owner.down:
                    owner.down = True
                    log.warning("stream_redis_down", stream_id=stream.id)
            if ended:
                return

    async def _delete(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.owner.call(self.owner.redis.delete(self._key, self._key + ":m"))


class _Remote:
    """Another replica's stream, read from its copy (:class:`~gateway.stream_store.Source`).
    A reader here holds the upstream there (``<id>:r``)."""

    def __init__(self, owner: RedisStreams, stream_id: str, api: str, count: int) -> None:
        self.owner, self.id, self.api, self.count = owner, stream_id, api, count

    def attach(self) -> None:
        """(Marked at each poll.)"""

    def detach(self) -> None:
        """(The mark expires.)"""

    async def read(self, at: int) -> tuple[list[bytes], bool]:
        owner, key = self.owner, self.owner.prefix + self.id
        while True:
            pipe = owner.redis.pipeline(transaction=True)
            pipe.lrange(key, at, -1)
            pipe.hget(key + ":m", "ended")
            pipe.exists(key + ":m")
            pipe.set(key + ":r", 1, px=READER_MS)
            events, ended, exists, _ = await owner.call(pipe.execute())
            if not exists:
                raise StreamNotFound("the stream is no longer kept")
            if events or ended:
                return list(events), bool(ended)
            await asyncio.sleep(POLL_S)
