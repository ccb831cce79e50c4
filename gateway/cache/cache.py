"""The response cache: look a request up, store an answer. (The pipeline stage that uses
it is :mod:`gateway.stages.cache`.)

Lookup, in order: eligibility (policy, ``Cache-Control: no-cache``), the exact layer (no
embedding needed), then the semantic layer: embed the last user message (one embedding per
request, kept in the request's memo for later stages), take the nearest entries of the same
scope, and serve the first whose cosine similarity and verifier score both pass the route's
operating point. Every backend call is bounded by ``lookup_timeout_ms``; a slow or failing
backend turns the request into a bypass (counted, logged), never an error.

Storing happens after the response's last byte, in a background task, and only for complete
answers (see :class:`~gateway.formats.answer.Answer`); never with ``Cache-Control:
no-store``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import structlog

from gateway.cache.backend import Backend, Entry
from gateway.cache.keys import CacheKey, cache_key, ineligible_reason
from gateway.cache.verifier import Verifier
from gateway.context import Headers, RequestContext
from gateway.embedding import Embed
from gateway.formats.answer import Answer
from gateway.policy import CachePolicy, OperatingPoint

__all__ = ["CacheStats", "Lookup", "ResponseCache", "cache_directives", "namespace_of"]

log = structlog.get_logger("gateway.cache")

_EMBED_TIMEOUT_S = 1.0


@dataclass
class CacheStats:
    """Counters for /metrics: lookups by result and layer, backend failures by operation."""

    lookups: dict[tuple[str, str], int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    stores: int = 0

    def count(self, result: str, layer: str = "") -> None:
        self.lookups[(result, layer)] = self.lookups.get((result, layer), 0) + 1

    def fail(self, op: str) -> None:
        self.failures[op] = self.failures.get(op, 0) + 1


@dataclass(slots=True)
class Lookup:
    """The outcome of a lookup. ``hit`` is the entry to serve; ``store`` says whether the
    response may be stored afterwards; ``vector`` is the request's embedding (or None)."""

    key: CacheKey | None = None
    store: bool = False
    hit: Entry | None = None
    vector: np.ndarray | None = None
    candidates: list[tuple[Entry, float, float]] = field(default_factory=list)
    max_tokens: int | None = None


def cache_directives(headers: Headers) -> set[str]:
    """The request's ``Cache-Control`` directives, lower-cased."""
    out: set[str] = set()
    for k, v in headers:
        if k == b"cache-control":
            out.update(d.strip().lower() for d in v.decode("latin-1").split(","))
    return out


def namespace_of(headers: Headers, key_id: str | None) -> str:
    """The key's namespace (``default`` without keys), narrowed by ``x-gateway-cache-
    namespace``; a client can never reach another key's entries through the header."""
    base = key_id or "default"
    for k, v in headers:
        if k == b"x-gateway-cache-namespace" and 0 < len(v) <= 128:
            return f"{base}/{v.decode('latin-1')}"
    return base


class ResponseCache:
    def __init__(self, backend: Backend, embed: Embed | None, verifier: Verifier | None):
        self.backend = backend
        self.embed = embed
        self.verifier = verifier
        self.stats = CacheStats()
        self.embedding = 0  # lookups waiting for their embedding now
        self._tasks: set[asyncio.Task[None]] = set()

    async def _bounded(self, op: str, work: Awaitable[Any], timeout_s: float) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                return await work
        except Exception as exc:
            self.stats.fail(op)
            log.warning("cache_backend_failed", op=op, error=type(exc).__name__)
            raise _Bypass from exc

    async def lookup(self, ctx: RequestContext, policy: CachePolicy) -> Lookup:
        """Look ``ctx`` up in its scope (``ctx.model``); the outcome goes to the record's
        ``cache*`` fields. Never raises for cache trouble: returns a Lookup without a hit
        instead."""
        started = time.perf_counter()
        result = Lookup()
        rec = ctx.record
        try:
            await self._lookup(ctx, policy, result)
        except _Bypass:
            rec.cache = "bypass"
            result.hit = None
        finally:
            rec.lookup_ms = round((time.perf_counter() - started) * 1000, 3)
        self.stats.count(rec.cache or "bypass", rec.cache_layer or "")
        return result

    async def _lookup(self, ctx: RequestContext, policy: CachePolicy, result: Lookup) -> None:
        data, rec, model = ctx.api.chat_view(ctx.body), ctx.record, ctx.model
        directives = cache_directives(ctx.headers)
        if ineligible_reason(data, policy.max_temperature) is not None:
            rec.cache = "bypass"
            return
        key = result.key = cache_key(data, namespace_of(ctx.headers, ctx.key_id), model)
        limit = data.get("max_completion_tokens", data.get("max_tokens"))
        result.max_tokens = limit if isinstance(limit, int) else None
        result.store = "no-store" not in directives
        if "no-cache" in directives:
            rec.cache = "bypass"
            return
        timeout = policy.lookup_timeout_ms / 1000
        rec.cache = "miss"
        entry = await self._bounded("get", self.backend.get_exact(key.exact, key.namespace),
                                    timeout)
        if entry is not None:
            result.hit = entry
            rec.cache, rec.cache_layer = "hit", "exact"
            return
        if not (policy.semantic and key.scope and self.embed is not None):
            return
        result.vector = ctx.memo.embeddings.get(key.query or "")
        if result.vector is None:
            result.vector = await self._embed(key.query or "", policy)
            if result.vector is None:
                return
            ctx.memo.embeddings[key.query or ""] = result.vector
        found = await self._bounded("search", self.backend.search(
            key.scope, result.vector, policy.candidates), timeout)
        try:
            result.candidates = [(e, sim, self._verify(key, result.vector, e))
                                 for e, sim in found]
        except Exception as exc:  # noqa: BLE001 - a broken entry is a miss, not a 500
            self.stats.fail("verify")
            log.warning("cache_verify_failed", error=type(exc).__name__)
            return
        hit = self.choose(result, policy.point(model))
        if hit is not None:
            result.hit = hit
            rec.cache, rec.cache_layer = "hit", "semantic"
        if result.candidates:
            best = next((c for c in result.candidates if c[0] is hit), result.candidates[0])
            rec.similarity, rec.verified = round(best[1], 4), round(best[2], 4)

    async def _embed(self, text: str, policy: CachePolicy) -> np.ndarray | None:
        """The text's embedding, or None (the embedder busy, failing or too slow)."""
        assert self.embed is not None
        if self.embedding >= policy.max_pending_embeddings:
            # The embedding thread is saturated: waiting would cost more than a miss saves.
            self.stats.fail("embed_busy")
            return None
        self.embedding += 1
        try:
            async with asyncio.timeout(_EMBED_TIMEOUT_S):
                vector: np.ndarray = (await self.embed([text]))[0]
                return vector
        except Exception as exc:  # noqa: BLE001 - no embedding: exact layer only
            self.stats.fail("embed")
            log.warning("cache_embed_failed", error=type(exc).__name__)
            return None
        finally:
            self.embedding -= 1

    def _verify(self, key: CacheKey, vector: np.ndarray, entry: Entry) -> float:
        if self.verifier is None or entry.vector is None:
            return 1.0
        return self.verifier.score(key.query or "", entry.query, vector, entry.vector)

    @staticmethod
    def choose(result: Lookup, point: OperatingPoint) -> Entry | None:
        """The nearest candidate that passes ``point``, or None."""
        for entry, sim, score in result.candidates:
            if sim >= point.similarity and score >= point.verifier \
                    and _fits(entry, result.max_tokens):
                return entry
        return None

    def store_later(self, result: Lookup, answer: Answer | None, policy: CachePolicy) -> None:
        """Store ``answer`` in the background (nothing when it is None or must not be)."""
        if answer is None or not result.store or result.key is None or result.hit is not None:
            return
        key = result.key
        entry = Entry(uuid.uuid4().hex, key.exact, key.scope if result.vector is not None
                      else None, key.namespace, key.query or "", answer.to_bytes())
        task = asyncio.get_running_loop().create_task(
            self._store(entry, result.vector, policy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(self, entry: Entry, vector: np.ndarray | None,
                     policy: CachePolicy) -> None:
        try:
            await self._bounded("put", self.backend.put(entry, vector, policy.ttl_s),
                                max(1.0, policy.lookup_timeout_ms / 1000))
            self.stats.stores += 1
        except _Bypass:
            pass

    async def drain(self) -> None:
        """Wait for pending stores (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def purge(self, namespace: str) -> int:
        return await self.backend.purge(namespace)

    async def aclose(self) -> None:
        await self.drain()
        await self.backend.aclose()


def _fits(entry: Entry, max_tokens: int | None) -> bool:
    """A cached answer longer than the request's max_tokens would not have been produced."""
    if max_tokens is None:
        return True
    n = orjson.loads(entry.answer).get("completion_tokens")
    return n is None or n <= max_tokens


class _Bypass(Exception):
    """A backend call failed or was too slow."""
