"""Where stored responses live: bytes under a key, for a time.

:class:`MemoryRecords` is in-process (one replica's; ``max_bytes`` in all, each gateway key
at most a share of them, its own least recently used first out: one key's writes never
evict another's records); :class:`RedisRecords` is a Redis every replica shares (``SET ..
EX``), so a conversation may continue on any replica; there the bounds are Redis's own
(``maxmemory`` and its eviction policy, which knows no keys: README's Security section).
Each record expires ``ttl_s`` after it was written. A Redis call that fails raises
:class:`StoreUnavailable` (503): a chained request cannot be served without its
conversation, and a write that fails is logged by the caller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from gateway.errors import GatewayError
from gateway.tenant_lru import TenantLRU

__all__ = ["MemoryRecords", "Records", "RedisRecords", "StoreUnavailable"]

#: Longest wait for one Redis call (ms).
REDIS_TIMEOUT_MS = 1_000


class StoreUnavailable(GatewayError):
    status = 503
    type = "server_error"
    code = "response_store_unavailable"


class Records(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: int, tenant: str = "") -> None: ...

    async def delete(self, key: str) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryRecords:
    """In-process records: ``key -> (expiry, bytes)``, at most ``max_bytes`` of values, each
    gateway key (``tenant``) at most ``share`` of them, least recently used first out within
    its own records (:class:`~gateway.tenant_lru.TenantLRU`: another key's writes never
    evict them); ``clock``: seconds (``time.monotonic``)."""

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic,
                 share: float = 1.0) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: TenantLRU[tuple[float, bytes]] = TenantLRU(max_bytes, share)

    @property
    def size(self) -> int:
        """Bytes of values held."""
        return self._entries.nbytes

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            self._entries.pop(key)
            return None
        return entry[1]

    async def put(self, key: str, value: bytes, ttl_s: int, tenant: str = "") -> None:
        self.put_now(key, value, ttl_s, tenant)

    def put_now(self, key: str, value: bytes, ttl_s: int, tenant: str = "") -> None:
        """:meth:`put` without a coroutine (nothing here waits)."""
        self._entries.put(tenant, key, (self._clock() + ttl_s, value), len(value))

    async def delete(self, key: str) -> bool:
        entry = self._entries.pop(key)
        return entry is not None and entry[0] > self._clock()

    async def aclose(self) -> None:
        self._entries = TenantLRU(self.max_bytes, 1.0)


class RedisRecords:
    """Records in Redis at ``url``, each key under ``prefix``."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis.asyncio

        self.prefix = prefix
        self._redis = redis.asyncio.Redis.from_url(url)

    async def get(self, key: str) -> bytes | None:
        value = await self._call(self._redis.get(self.prefix + key))
        return value if isinstance(value, bytes) else None

    async def put(self, key: str, value: bytes, ttl_s: int, tenant: str = "") -> None:
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
