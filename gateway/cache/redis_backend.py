"""The ``redis`` cache backend: RedisVL on Redis Stack >= 7.2 (or Redis 8), shared by replicas.

Each entry is a Redis hash ``{prefix}e:{id}`` indexed by RedisVL (tags ``scope`` and
``namespace``, a cosine ``FLAT`` vector field of the embedder's dimension, created on first
use); the exact layer is a plain key
``{prefix}x:{namespace}:{exact}`` holding the entry id, the namespace percent-encoded (no
``:`` nor glob character left in it), so a purge's ``SCAN`` pattern matches one namespace
exactly: ``team``'s never ``team:eng``'s. TTL is Redis key expiry on both, so
expired entries vanish by themselves. What bounds the memory is Redis's ``maxmemory`` and
its eviction policy, which knows no gateway keys (README's Security section). Connection failures raise; the cache stage bounds every
call with a timeout and bypasses on failure, and redis-py reconnects on the next call.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import quote

import numpy as np
from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT
from redisvl.index import AsyncSearchIndex
from redisvl.query import VectorQuery
from redisvl.query.filter import Tag
from redisvl.schema import IndexSchema

from gateway.cache.backend import Backend, Entry

__all__ = ["RedisBackend"]


def _escape(value: str) -> str:
    return value.replace(":", "_")


def _encoded(namespace: str) -> str:
    """``namespace`` with every character but letters, digits and ``_.-~`` as ``%XX``."""
    return quote(namespace, safe="")


def _glob(value: str) -> str:
    """``value`` as a literal in a Redis ``MATCH`` pattern."""
    return "".join("\\" + c if c in "\\*?[]" else c for c in value)


def _text(value: bytes | str) -> str:
    # redis-py types replies as bytes or str (per decode_responses); this client's are bytes.
    return value.decode() if isinstance(value, bytes) else value


class RedisBackend(Backend):
    def __init__(self, url: str, prefix: str = "gwcache:", dim: int = 384,
                 socket_timeout_s: float = 1.0):
        self.prefix = prefix
        self.client = Redis.from_url(url, socket_timeout=socket_timeout_s,
                                     socket_connect_timeout=socket_timeout_s,
                                     retry_on_timeout=False, health_check_interval=10)
        self.dim = dim
        self.index: AsyncSearchIndex | None = None

    async def _ensure_index(self, dim: int) -> AsyncSearchIndex:
        """The vector index, created on first use with the embedder's dimension."""
        if self.index is None or self.dim != dim:
            schema = IndexSchema.from_dict({
                "index": {"name": f"{self.prefix}idx", "prefix": f"{self.prefix}e",
                          "storage_type": "hash"},
                "fields": [
                    {"name": "scope", "type": "tag"},
                    {"name": "namespace", "type": "tag"},
                    {"name": "vector", "type": "vector", "attrs": {
                        "dims": dim, "distance_metric": "cosine", "algorithm": "flat",
                        "datatype": "float32"}},
                ],
            })
            index = AsyncSearchIndex(schema, redis_client=self.client)
            await index.create(overwrite=False)
            self.index, self.dim = index, dim
        return self.index

    def _exact_key(self, namespace: str, exact: str) -> str:
        return f"{self.prefix}x:{_encoded(namespace)}:{exact}"

    def _entry_key(self, entry_id: str) -> str:
        return f"{self.prefix}e:{entry_id}"

    @staticmethod
    def _entry(entry_id: str, h: dict[bytes, bytes]) -> Entry:
        scope = h.get(b"scope", b"").decode()
        raw = h.get(b"vector")
        return Entry(entry_id, h[b"exact"].decode(), scope if scope != "-" else None,
                     h[b"namespace_raw"].decode(), h[b"query"].decode(), h[b"answer"],
                     float(h[b"created"]),
                     np.frombuffer(raw, dtype=np.float32) if raw else None)

    async def get_exact(self, exact: str, namespace: str) -> Entry | None:
        entry_id = await self.client.get(self._exact_key(namespace, exact))
        if entry_id is None:
            return None
        entry_id = _text(entry_id)
        # Without decode_responses, every field and value of the hash is bytes.
        h = cast("dict[bytes, bytes]", await self.client.hgetall(self._entry_key(entry_id)))
        return self._entry(entry_id, h) if h else None

    async def search(self, scope: str, vector: np.ndarray, k: int) -> list[tuple[Entry, float]]:
        index = await self._ensure_index(len(vector))
        query = VectorQuery(vector.astype(np.float32).tobytes(), "vector",
                            return_fields=["id"], filter_expression=Tag("scope") == scope,
                            num_results=k)
        results: list[dict[str, Any]] = await index.query(query)
        async with self.client.pipeline(transaction=False) as pipe:  # one round trip
            for r in results:
                pipe.hgetall(r["id"])
            hashes = await pipe.execute()
        out = []
        for r, h in zip(results, hashes, strict=True):
            if not h:  # expired between the search and the read
                continue
            entry_id = r["id"].removeprefix(self._entry_key(""))
            out.append((self._entry(entry_id, h), 1.0 - float(r["vector_distance"])))
        return out

    async def put(self, entry: Entry, vector: np.ndarray | None, ttl_s: float) -> None:
        if vector is not None:
            await self._ensure_index(len(vector))
        ms = max(1, int(ttl_s * 1000))
        mapping: dict[FieldT, EncodableT] = {
            "exact": entry.exact, "scope": entry.scope or "-",
            "namespace": _escape(entry.namespace), "namespace_raw": entry.namespace,
            "query": entry.query, "answer": entry.answer, "created": entry.created,
        }
        if vector is not None and entry.scope is not None:
            mapping["vector"] = vector.astype(np.float32).tobytes()
        key = self._entry_key(entry.id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=mapping)
            pipe.pexpire(key, ms)
            pipe.set(self._exact_key(entry.namespace, entry.exact), entry.id, px=ms)
            await pipe.execute()

    async def purge(self, namespace: str) -> int:
        n = 0
        exact = f"{_glob(self.prefix)}x:{_encoded(namespace)}:*"  # this namespace's only
        async for key in self.client.scan_iter(match=exact, count=1000):
            entry_id = await self.client.get(key)
            await self.client.delete(key)
            if entry_id is not None:
                n += await self.client.delete(self._entry_key(_text(entry_id)))
        # entries whose exact key already expired or was replaced
        async for key in self.client.scan_iter(match=f"{_glob(self.prefix)}e:*", count=1000):
            if await self.client.hget(key, "namespace_raw") == namespace.encode():
                n += await self.client.delete(key)
        return n

    async def aclose(self) -> None:
        await self.client.aclose()
