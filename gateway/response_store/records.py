"""Where stored responses live: bytes under a key, for a time.

:class:`MemoryRecords` is in-process (one replica's; least recently used first out beyond
``max_bytes``); :class:`RedisRecords` is a Redis every replica shares (``SET .. EX``), so a
conversation may continue on any replica. Each record expires ``ttl_s`` after it was
written. A Redis call that fails raises :class:`StoreUnavailable` (503): a chained request
cannot be served without its conversation, and a write that fails is logged by the caller.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from gateway.errors import GatewayError

__all__ = ["MemoryRecords", "Records", "RedisRecords", "StoreUnavailable"]

#: Longest wait for one Redis call (ms).
REDIS_TIMEOUT_MS = 1_000


class StoreUnavailable(GatewayError):
    status = 503
    type = "server_error"
    code = "response_store_unavailable"


class Records(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: int) -> None: ...

    async def delete(self, key: str) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryRecords:
    """In-process records: ``key -> (expiry, bytes)`` in least recently used order, at most
    ``max_bytes`` of values; ``clock``: seconds (``time.monotonic``)."""

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self.size = 0
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry[1]

    async def put(self, key: str, value: bytes, ttl_s: int) -> None:
        self.put_now(key, value, ttl_s)

    def put_now(self, key: str, value: bytes, ttl_s: int) -> None:
        """:meth:`put` without a coroutine (nothing here waits)."""
        if key in self._entries:
            self._drop(key)
        if len(value) > self.max_bytes:
            return
        self._entries[key] = (self._clock() + ttl_s, value)
        self.size += len(value)
        while self.size > self.max_bytes:
            self._drop(next(iter(self._entries)))

    async def delete(self, key: str) -> bool:
        if key not in self._entries:
            return False
        expired = self._entries[key][0] <= self._clock()
        self._drop(key)
        return not expired

    def _drop(self, key: str) -> None:
        self.size -= len(self._entries.pop(key)[1])

    async def aclose(self) -> None:
        self._entries.clear()
        self.size = 0


class RedisRecords:
    """Records in Redis at ``url``, each key under ``prefix``."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis.asyncio

        self.prefix = prefix
        self._redis = redis.asyncio.Redis.from_url(url)

    async def get(self, key: str) -> bytes | None:
        value = await self._call(self._redis.get(self.prefix + key))
        return value if isinstance(value, bytes) else None

    async def put(self, key: str, value: bytes, ttl_s: int) -> None:
        await self._call(self._redis.set(self.prefix + key, value, ex=ttl_s))

    async def delete(self, key: str) -> bool:
        return bool(await self._call(self._redis.delete(self.prefix + key)))

    async def _call(self, call: object) -> object:
        from redis.exceptions import RedisError

        try:
            async with asyncio.timeout(REDIS_TIMEOUT_MS / 1000):
                return await call  # type: ignore[misc]
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable("the response store (Redis) is not answering; try again "
                                   "shortly") from exc

    async def aclose(self) -> None:
        await self._redis.aclose()
