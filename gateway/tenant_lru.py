"""A least-recently-used store shared by tenants (gateway keys), in which one tenant's
writes cannot push out another's values: what the response store and the response cache
keep in process memory, and the error bound's per-namespace state.

Each value belongs to one tenant and sits in that tenant's own LRU order. Two bounds, each
in bytes and optionally in values:

- **the tenant's quota**, ``share`` of the total: a write that takes its tenant past it
  evicts that tenant's own least recently used values, never another's. With shares that
  add up to at most 1 (the default ``1 / number of gateway keys``), the total is never
  exceeded and a tenant's values leave only by its own writes, expiry or deletion;
- **the total**: when shares add up to more (a tenant may use room others leave idle), a
  write that takes the total past its bound evicts the least recently used values of the
  tenant that holds the most (max-min fairness): a tenant holding no more than any other is
  never evicted by another's writes; the writer is evicted first on a tie.

A value larger than its tenant's quota is not kept (it is "evicted" at once). Not
thread-safe: everything runs on the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["TenantLRU"]

V = TypeVar("V")


class _Held(Generic[V]):
    """One tenant's values, least recently used first, and their bytes."""

    __slots__ = ("items", "nbytes")

    def __init__(self) -> None:
        self.items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self.nbytes = 0


class TenantLRU(Generic[V]):
    """Values by key, each owned by a tenant. ``max_bytes``: the total (bytes, as the
    caller counts them); ``max_items``: the most values in all (None: unbounded); ``share``:
    a tenant's quota as a fraction (0, 1] of each bound."""

    def __init__(self, max_bytes: int, share: float = 1.0, max_items: int | None = None
                 ) -> None:
        if not 0 < share <= 1:
            raise ValueError("share must be in (0, 1]")
        self.max_bytes, self.max_items = max_bytes, max_items
        self.quota_bytes = max(1, int(max_bytes * share))
        self.quota_items = None if max_items is None else max(1, int(max_items * share))
        self.nbytes = 0
        self._owner: dict[str, str] = {}
        self._tenants: dict[str, _Held[V]] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def __contains__(self, key: object) -> bool:
        return key in self._owner

    def tenant_bytes(self, tenant: str) -> int:
        """The bytes ``tenant``'s values hold."""
        held = self._tenants.get(tenant)
        return 0 if held is None else held.nbytes

    def peek(self, key: str) -> V | None:
        """The value under ``key`` (its recency unchanged), or None."""
        tenant = self._owner.get(key)
        return None if tenant is None else self._tenants[tenant].items[key][0]

    def get(self, key: str) -> V | None:
        """The value under ``key``, now its tenant's most recently used, or None."""
        tenant = self._owner.get(key)
        if tenant is None:
            return None
        items = self._tenants[tenant].items
        items.move_to_end(key)
        return items[key][0]

    def items(self) -> Iterator[tuple[str, V]]:
        """Every (key, value), tenant by tenant (a snapshot: the caller may pop)."""
        return iter([(k, v) for held in self._tenants.values()
                     for k, (v, _) in held.items.items()])

    def values(self) -> Iterator[V]:
        """Every value, tenant by tenant."""
        return (v for held in self._tenants.values() for v, _ in held.items.values())

    def pop(self, key: str) -> V | None:
        """Remove ``key``; its value, or None."""
        tenant = self._owner.pop(key, None)
        if tenant is None:
            return None
        held = self._tenants[tenant]
        value, nbytes = held.items.pop(key)
        held.nbytes -= nbytes
        self.nbytes -= nbytes
        if not held.items:
            del self._tenants[tenant]
        return value

    def put(self, tenant: str, key: str, value: V, nbytes: int) -> list[tuple[str, V]]:
        """Keep ``value`` under ``key`` for ``tenant`` (replacing any value there), as its
        most recently used; returns what was evicted to make room, oldest first: this
        value itself when it is larger than a tenant's quota (then nothing else)."""
        self.pop(key)
        if nbytes > self.quota_bytes:
            return [(key, value)]
        held = self._tenants.get(tenant)
        if held is None:
            held = self._tenants[tenant] = _Held()
        held.items[key] = (value, nbytes)
        held.nbytes += nbytes
        self.nbytes += nbytes
        self._owner[key] = tenant
        evicted: list[tuple[str, V]] = []
        while held.nbytes > self.quota_bytes or self._over(len(held.items), self.quota_items):
            evicted.append(self._evict(tenant))
        while self.nbytes > self.max_bytes or self._over(len(self._owner), self.max_items):
            evicted.append(self._evict(self._heaviest(tenant)))
        return evicted

    def resize(self, key: str, nbytes: int) -> list[tuple[str, V]]:
        """``key``'s value (one that grows in place: a stream being kept) now counts
        ``nbytes``, its recency unchanged; returns what was evicted to make room, as
        :meth:`put` does (``key``'s own value too when it is over its tenant's quota, or
        its tenant's least recently used)."""
        tenant = self._owner.get(key)
        if tenant is None:
            return []
        held = self._tenants[tenant]
        value, old = held.items[key]
        if nbytes > self.quota_bytes:
            self.pop(key)
            return [(key, value)]
        held.items[key] = (value, nbytes)  # (an existing key keeps its place)
        held.nbytes += nbytes - old
        self.nbytes += nbytes - old
        evicted: list[tuple[str, V]] = []
        while tenant in self._tenants and (held.nbytes > self.quota_bytes
                                           or self._over(len(held.items), self.quota_items)):
            evicted.append(self._evict(tenant))
        while self.nbytes > self.max_bytes or self._over(len(self._owner), self.max_items):
            evicted.append(self._evict(self._heaviest(tenant)))
        return evicted

    @staticmethod
    def _over(n: int, bound: int | None) -> bool:
        return bound is not None and n > bound

    def _heaviest(self, writer: str) -> str:
        """The tenant to evict from when the total is over: the one holding the most (bytes
        when they are over, else values); the writer on a tie."""
        by_bytes = self.nbytes > self.max_bytes
        return max(self._tenants, key=lambda t: (
            self._tenants[t].nbytes if by_bytes else len(self._tenants[t].items),
            t == writer))

    def _evict(self, tenant: str) -> tuple[str, V]:
        key = next(iter(self._tenants[tenant].items))
        value = self.pop(key)
        assert value is not None
        return key, value
