"""The cache storage interface, and the in-process ``memory`` backend.

A backend stores :class:`Entry` objects: a complete answer, the query text it answered, its
scope and namespace, under an exact key and with a unit-length embedding. Two backends
implement the same contract (tests/gateway/cache/test_backends.py runs against both):
``memory`` (this module: numpy cosine search per scope, LRU bounded by entries and bytes
with each gateway key's share, TTL)
and ``redis`` (:mod:`gateway.cache.redis_backend`: RedisVL, shared by all replicas).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.tenant_lru import TenantLRU

__all__ = ["Backend", "Entry", "MemoryBackend", "at_once", "tenant_of"]


@dataclass(slots=True)
class Entry:
    """A cached answer. ``answer`` is the serialized answer (see :mod:`gateway.formats.answer`);
    ``query`` is the last user message it answered (compared by the verifier, never logged)."""

    id: str
    exact: str
    scope: str | None
    namespace: str
    query: str
    answer: bytes
    created: float = field(default_factory=time.time)
    vector: np.ndarray | None = None  # [dim] float32, unit length (semantic entries)

    @property
    def nbytes(self) -> int:
        return len(self.answer) + len(self.query) + 256


class Backend(abc.ABC):
    """Every call may raise; the cache stage turns failures and slow calls into a bypass."""

    #: Its calls never wait on I/O (they end at their first step): no timeout is set on
    #: them, which would cost more than the call itself.
    in_process = False

    @abc.abstractmethod
    async def get_exact(self, exact: str, namespace: str) -> Entry | None:
        """The entry stored under this exact key, unless expired."""

    @abc.abstractmethod
    async def search(self, scope: str, vector: np.ndarray, k: int) -> list[tuple[Entry, float]]:
        """Up to ``k`` entries of ``scope``, nearest first, with cosine similarity."""

    def may_hold(self, scope: str) -> bool:
        """False only when ``scope`` surely holds no entry (known without I/O): a semantic
        lookup there can only miss, so the request need not wait for it."""
        return True

    @abc.abstractmethod
    async def put(self, entry: Entry, vector: np.ndarray | None, ttl_s: float) -> None:
        """Store ``entry`` (and its unit ``vector`` [dim] float32 when it has a scope)."""

    @abc.abstractmethod
    async def purge(self, namespace: str) -> int:
        """Drop every entry of ``namespace``; returns how many."""

    async def aclose(self) -> None:
        """Release connections."""


class _Scope:
    """Vectors of one scope in a growable matrix; rows of deleted entries are compacted."""

    __slots__ = ("ids", "matrix", "n", "row")

    def __init__(self, dim: int):
        self.matrix = np.empty((8, dim), dtype=np.float32)
        self.ids: list[str] = []
        self.row: dict[str, int] = {}
        self.n = 0

    def add(self, entry_id: str, vector: np.ndarray) -> None:
        if self.n == len(self.matrix):
            grown = np.empty((2 * len(self.matrix), self.matrix.shape[1]), dtype=np.float32)
            grown[:self.n] = self.matrix[:self.n]
            self.matrix = grown
        self.matrix[self.n] = vector
        self.ids.append(entry_id)
        self.row[entry_id] = self.n
        self.n += 1

    def remove(self, entry_id: str) -> None:
        i = self.row.pop(entry_id)
        last = self.n - 1
        if i != last:  # move the last row into the hole
            self.matrix[i] = self.matrix[last]
            self.ids[i] = self.ids[last]
            self.row[self.ids[i]] = i
        self.ids.pop()
        self.n = last


def tenant_of(namespace: str) -> str:
    """The gateway key a namespace belongs to: its part before the first ``/``
    (:func:`gateway.cache.keys.namespace_of` makes ``KEY`` or ``KEY/NAME``; key ids hold no
    ``/``)."""
    return namespace.partition("/")[0]


class MemoryBackend(Backend):
    """In-process: per-scope brute-force cosine (a matrix-vector product), LRU eviction
    past ``max_entries`` or ``max_bytes``, each gateway key (all its namespaces) within
    ``share`` of both, its own least recently used evicted beyond it
    (:class:`~gateway.tenant_lru.TenantLRU`: another key's writes never evict its entries);
    expiry checked on read and on eviction."""

    in_process = True

    def __init__(self, max_entries: int = 100_000, max_bytes: int = 512 * 2**20,
                 clock: Callable[[], float] | None = None, share: float = 1.0):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock or time.time
        #: id -> (entry, expiry), per key least recently used first
        self.entries: TenantLRU[tuple[Entry, float]] = TenantLRU(max_bytes, share,
                                                                  max_entries)
        self.exact: dict[tuple[str, str], str] = {}
        self.scopes: dict[str, _Scope] = {}

    @property
    def nbytes(self) -> int:
        return self.entries.nbytes

    def _drop(self, entry_id: str) -> None:
        item = self.entries.pop(entry_id)
        if item is not None:
            self._unindex(entry_id, item[0])

    def _unindex(self, entry_id: str, entry: Entry) -> None:
        if self.exact.get((entry.namespace, entry.exact)) == entry_id:
            del self.exact[(entry.namespace, entry.exact)]
        if entry.scope is not None and entry.scope in self.scopes:
            scope = self.scopes[entry.scope]
            if entry_id in scope.row:
                scope.remove(entry_id)
            if scope.n == 0:
                del self.scopes[entry.scope]

    def _live(self, entry_id: str) -> Entry | None:
        item = self.entries.get(entry_id)
        if item is None:
            return None
        entry, expires = item
        if expires <= self.clock():
            self._drop(entry_id)
            return None
        return entry

    async def get_exact(self, exact: str, namespace: str) -> Entry | None:
        entry_id = self.exact.get((namespace, exact))
        return self._live(entry_id) if entry_id is not None else None

    def may_hold(self, scope: str) -> bool:
        return scope in self.scopes

    async def search(self, scope: str, vector: np.ndarray, k: int) -> list[tuple[Entry, float]]:
        rows = self.scopes.get(scope)
        if rows is None:
            return []
        sims = rows.matrix[:rows.n] @ vector
        order = np.argsort(-sims)[:k] if rows.n > k else np.argsort(-sims)
        ids = [rows.ids[i] for i in order]
        out = []
        for entry_id, sim in zip(ids, sims[order], strict=True):
            entry = self._live(entry_id)
            if entry is not None:
                out.append((entry, float(sim)))
        return out

    async def put(self, entry: Entry, vector: np.ndarray | None, ttl_s: float) -> None:
        old = self.exact.get((entry.namespace, entry.exact))
        if old is not None:
            self._drop(old)
        if vector is not None:
            entry.vector = vector
        evicted = self.entries.put(tenant_of(entry.namespace), entry.id,
                                   (entry, self.clock() + ttl_s), entry.nbytes)
        self.exact[(entry.namespace, entry.exact)] = entry.id
        if entry.scope is not None and vector is not None:
            scope = self.scopes.get(entry.scope)
            if scope is None:
                scope = self.scopes[entry.scope] = _Scope(len(vector))
            scope.add(entry.id, vector)
        for entry_id, (gone, _) in evicted:  # this entry too when it exceeds a key's share
            self._unindex(entry_id, gone)

    async def purge(self, namespace: str) -> int:
        doomed = [i for i, (e, _) in self.entries.items() if e.namespace == namespace]
        for entry_id in doomed:
            self._drop(entry_id)
        return len(doomed)


def at_once(work: Coroutine[Any, Any, Any]) -> Any:
    """The result of an in-process backend's call, which ends at its first step (see
    :attr:`Backend.in_process`), run here without a task."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value
    work.close()
    raise RuntimeError("an in-process cache backend's call waited")
