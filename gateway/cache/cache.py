"""The response cache: look a request up, store an answer. (The pipeline stage that uses
it is :mod:`gateway.stages.cache`.)

A lookup has two steps. :meth:`ResponseCache.lookup`: eligibility (policy, ``Cache-Control:
no-cache``) and the exact layer (no embedding needed). :meth:`ResponseCache.semantic`, when
the exact layer missed: embed the last user message (one embedding per request, shared
with later stages through ``ctx.embeddings``), take the nearest entries of the same scope,
and serve the first that keeps the contract (:mod:`gateway.cache.contract`: numbers,
negation, names, direction) and that the error bound serves (:mod:`gateway.cache.bound`:
the chance its answer is wrong within ``max_error_rate``; with 0 there, the route's static
operating point instead). A request that goes upstream although it had a candidate teaches
the bound: after it is answered, its answer is compared with the candidate's
(:mod:`gateway.cache.agreement`), in the background. The stage runs the second step as a
task and decides how long to wait for it. Neither
writes the request's record: the outcome is in the :class:`Lookup`, which the stage copies
when it knows what the request got. Every backend call is bounded by ``lookup_timeout_ms``;
a slow or failing backend turns the lookup into a bypass (counted, logged), never an error.

Storing happens after the response's last byte, and only for complete answers (see
:class:`~gateway.formats.answer.Answer`); never with ``Cache-Control: no-store``. It waits for
the semantic lookup (its embedding is stored with the answer), in a background task; with
nothing to wait for or learn and an in-process backend, it is done at once.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from gateway import jsonio
from gateway.cache.agreement import agree
from gateway.cache.backend import Backend, Entry, at_once
from gateway.cache.bound import ErrorBound, Prior
from gateway.cache.contract import terms, veto
from gateway.cache.keys import (
    Bypass,
    CacheKey,
    cache_directives,
    cache_key,
    ineligible_reason,
    namespace_of,
)
from gateway.cache.policy_verifier import PairVerifier
from gateway.context import RequestContext
from gateway.embedding import Embed
from gateway.formats.answer import Answer
from gateway.models import model_key
from gateway.policy import CachePolicy, OperatingPoint
from gateway.requestlog import RequestRecord

__all__ = ["CacheStats", "Lookup", "ResponseCache"]

log = structlog.get_logger("gateway.cache")

_EMBED_TIMEOUT_S = 1.0


@dataclass
class CacheStats:
    """Counters for /metrics: lookups by result and layer, backend failures by operation."""

    lookups: dict[tuple[str, str], int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    stores: int = 0
    #: Requests sent upstream before their semantic lookup ended (past lookup_budget_ms).
    over_budget: int = 0
    #: Semantic hits found past the budget, by what became of them: ``served`` (the
    #: upstream call cancelled), ``ignored`` (its upstream may bill a cancelled call),
    #: ``too_late`` (the upstream had answered first).
    late_hits: dict[str, int] = field(default_factory=dict)

    def count(self, result: str, layer: str = "") -> None:
        self.lookups[(result, layer)] = self.lookups.get((result, layer), 0) + 1

    def late(self, outcome: str) -> None:
        self.late_hits[outcome] = self.late_hits.get(outcome, 0) + 1

    def fail(self, op: str) -> None:
        self.failures[op] = self.failures.get(op, 0) + 1


@dataclass(slots=True)
class Lookup:
    """The outcome of a lookup. ``hit`` is the entry to serve; ``store`` says whether the
    response may be stored afterwards; ``vector`` is the request's embedding (or None).

    ``probe``: the candidate (entry, cosine, the score the bound reads) whose answer the fresh
    one is to be compared with (the bound's outcome); ``group``: the bound's group (the
    public model, in the candidates' namespace: each namespace's bound is its own).
    ``semantic``: the semantic layer is still to run (:meth:`ResponseCache.semantic`);
    ``possible``: it could hit (False when the scope holds no entry: it then only embeds,
    for the store). The log line's fields so far: ``result`` (``hit``, ``miss``,
    ``bypass``), ``layer``, ``similarity``, ``verified``, ``ms`` (the whole lookup's time);
    ``written``: they were copied into the log line (:meth:`write`).
    """

    key: CacheKey | None = None
    store: bool = False
    hit: Entry | None = None
    vector: np.ndarray | None = None
    candidates: list[tuple[Entry, float, float]] = field(default_factory=list)
    probe: tuple[Entry, float, float] | None = None
    group: str = ""
    max_tokens: int | None = None
    semantic: bool = False
    possible: bool = True
    result: str = "bypass"
    layer: str | None = None
    similarity: float | None = None
    verified: float | None = None
    ms: float | None = None
    started: float = field(default_factory=time.perf_counter)
    written: bool = False
    _stored: dict[str, Any] | None = None

    def write(self, rec: RequestRecord) -> None:
        """Copy the outcome into the request's log line."""
        rec.cache, rec.cache_layer, rec.lookup_ms = self.result, self.layer, self.ms
        rec.similarity, rec.verified = self.similarity, self.verified
        self.written = True

    def stored(self, entry: Entry) -> Any:
        """``entry``'s stored answer parsed, once per lookup (the candidates' token counts
        and the hit's answer both read it). Raises JSONDecodeError for a broken entry."""
        parsed = self._stored if self._stored is not None else {}
        found = parsed.get(entry.id)
        if found is None:
            found = parsed[entry.id] = jsonio.loads(entry.answer)
            self._stored = parsed
        return found

    def _took(self) -> None:
        self.ms = round((time.perf_counter() - self.started) * 1000, 3)


class ResponseCache:
    def __init__(self, backend: Backend, embed: Embed | None, verifier: PairVerifier | None):
        self.backend = backend
        self.embed = embed
        self.verifier = verifier
        self.stats = CacheStats()
        self.embedding = 0  # semantic lookups under way, and answers being compared
        self._tasks: set[asyncio.Task[None]] = set()  # semantic lookups and stores
        self.bound: ErrorBound | None = None  # made on first use, from the policy

    async def _bounded(self, op: str, work: Awaitable[Any], timeout_s: float) -> Any:
        try:
            if self.backend.in_process:  # nothing to wait for (a timeout: ~33k instructions)
                return await work
            async with asyncio.timeout(timeout_s):
                return await work
        except Exception as exc:
            self._failed(op, exc)
            raise Bypass from exc

    def _failed(self, op: str, exc: Exception) -> None:
        self.stats.fail(op)
        log.warning("cache_backend_failed", op=op, error=type(exc).__name__)

    async def lookup(self, ctx: RequestContext, policy: CachePolicy) -> Lookup:
        """Eligibility and the exact layer for ``ctx`` in its scope (``ctx.model``). When the
        exact layer misses and the semantic layer applies, the Lookup says ``semantic``:
        run :meth:`semantic` next. Never raises for cache trouble (a bypass instead)."""
        result = Lookup()
        try:
            await self._exact(ctx, policy, result)
        except Bypass:
            result.result, result.hit, result.semantic = "bypass", None, False
        result._took()
        return result

    def start_semantic(self, ctx: RequestContext, policy: CachePolicy,
                       result: Lookup) -> asyncio.Task[None]:
        """:meth:`semantic` as a task, kept until it ends (:meth:`drain` waits for it)."""
        self.embedding += 1  # now, not at the task's first step: a burst sees it at once
        task = asyncio.get_running_loop().create_task(self.semantic(ctx, policy, result))
        self._tasks.add(task)
        task.add_done_callback(self._semantic_done)
        return task

    def _semantic_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.embedding -= 1

    async def semantic(self, ctx: RequestContext, policy: CachePolicy, result: Lookup) -> None:
        """The semantic layer of a lookup whose exact layer missed; fills ``result``. Never
        raises for cache trouble: the result is then a miss (no embedding) or a bypass (a
        backend call failed), counted and logged."""
        try:
            await self._semantic(ctx, policy, result)
        except Bypass:
            result.result, result.hit = "bypass", None
        except Exception as exc:  # a bug in a lookup is a bypass, never a 500
            self.stats.fail("semantic")
            log.exception("cache_semantic_failed", error=type(exc).__name__)
            result.result, result.hit = "bypass", None
        finally:
            result._took()

    async def _exact(self, ctx: RequestContext, policy: CachePolicy, result: Lookup) -> None:
        data, headers, first = ctx.chat, ctx.headers, ctx.header_first
        directives = cache_directives(headers, first)
        if ineligible_reason(data, policy.max_temperature) is not None:
            return
        key = result.key = cache_key(data, namespace_of(headers, ctx.key_id, first), ctx.model,
                                     ctx.semantic_query)
        limit = data.get("max_completion_tokens", data.get("max_tokens"))
        result.max_tokens = limit if isinstance(limit, int) else None
        result.store = "no-store" not in directives
        if "no-cache" in directives:
            return
        result.result = "miss"
        entry = await self._bounded("get", self.backend.get_exact(key.exact, key.namespace),
                                    policy.lookup_timeout_ms / 1000)
        if entry is not None:
            result.hit = entry
            result.result, result.layer = "hit", "exact"
            return
        if policy.semantic and key.scope and self.embed is not None:
            if self.embedding >= policy.max_pending_embeddings:  # saturated (a burst): a
                self.stats.fail("embed_busy")  # miss now, not a task and a wait for nothing
                return
            result.semantic = True
            result.possible = self.backend.may_hold(key.scope)

    async def _semantic(self, ctx: RequestContext, policy: CachePolicy,
                        result: Lookup) -> None:
        key = result.key
        assert key is not None and key.scope is not None and key.query is not None
        result.vector = await ctx.embeddings.compute(key.query, self._embed)
        if result.vector is None or not result.possible:
            return
        found = await self._bounded("search", self.backend.search(
            key.scope, result.vector, policy.candidates), policy.lookup_timeout_ms / 1000)
        asked = terms(key.query)
        try:  # the contract first: a candidate it refuses is never scored nor served
            result.candidates = [(e, sim, self._verify(key, result.vector, e))
                                 for e, sim in found if veto(asked, terms(e.query)) is None]
        except Exception as exc:  # noqa: BLE001 - a broken entry is a miss, not a 500
            self.stats.fail("verify")
            log.warning("cache_verify_failed", error=type(exc).__name__)
            return
        result.group = ctx.model
        point = policy.point(model_key(ctx.model, ctx.route, policy.routes))
        hit = (self._within_bound(result, policy, point.similarity)
               if policy.max_error_rate > 0 else self.choose(result, point))
        if hit is not None:
            result.hit = hit
            result.result, result.layer = "hit", "semantic"
        if result.candidates:
            best = next((c for c in result.candidates if c[0] is hit), result.candidates[0])
            result.similarity, result.verified = round(best[1], 4), round(best[2], 4)

    async def _embed(self, text: str) -> np.ndarray | None:
        """The text's embedding, or None (the embedder failing or too slow)."""
        assert self.embed is not None
        try:
            async with asyncio.timeout(_EMBED_TIMEOUT_S):
                vector: np.ndarray = (await self.embed([text]))[0]
                return vector
        except Exception as exc:  # noqa: BLE001 - no embedding: exact layer only
            self.stats.fail("embed")
            log.warning("cache_embed_failed", error=type(exc).__name__)
            return None

    def _verify(self, key: CacheKey, vector: np.ndarray, entry: Entry) -> float:
        if self.verifier is None or entry.vector is None:
            return 1.0
        return self.verifier.score(key.query or "", entry.query, vector, entry.vector)

    def _within_bound(self, result: Lookup, policy: CachePolicy, floor: float) -> Entry | None:
        """The nearest candidate past the cosine ``floor`` that the error bound serves, or
        None; sets the probe (the nearest candidate, or the one explored)."""
        bound = self._bound(policy)
        for entry, sim, score in result.candidates:
            if sim < floor or not _fits(result, entry):
                continue
            # Without a verifier a candidate scores 1.0 (for the static point); the bound
            # must not read that as certainty.
            read = score if self.verifier is not None else 0.0
            decision = bound.decide(result.group, entry.id, sim, read, entry.namespace)
            if decision == "serve":
                return entry
            if result.probe is None or decision == "explore":
                result.probe = (entry, sim, read)
            if decision == "explore":
                return None
        return None

    def _bound(self, policy: CachePolicy) -> ErrorBound:
        if self.bound is None:  # the shipped prior is the MLP verifier's scores'
            prior = Prior.load()
            if policy.verifier != "mlp":
                prior = prior.cosine_only()
            self.bound = ErrorBound(policy.max_error_rate, policy.explore_share, prior)
        self.bound.configure(policy.max_error_rate, policy.explore_share)
        return self.bound

    @staticmethod
    def choose(result: Lookup, point: OperatingPoint) -> Entry | None:
        """The nearest candidate that passes ``point``, or None."""
        for entry, sim, score in result.candidates:
            if sim >= point.similarity and score >= point.verifier \
                    and _fits(result, entry):
                return entry
        return None

    def store_later(self, result: Lookup, answer: Answer | None, policy: CachePolicy,
                    after: asyncio.Task[None] | None = None) -> None:
        """Store ``answer`` in the background, once ``after`` (the semantic lookup, still
        running) has ended (at once when nothing is pending or to learn and the backend is
        in-process): nothing when it is None, must not be stored, or a hit was found
        meanwhile."""
        if answer is None or not result.store or result.key is None or result.hit is not None:
            return
        if after is None and result.probe is None and self.backend.in_process:
            # Nothing to wait for or learn, a put that ends at its first step: done now, not
            # in a task of its own (~14k instructions a task).
            try:
                at_once(self.backend.put(self._entry(result, answer), result.vector, policy.ttl_s))
                self.stats.stores += 1
            except Exception as exc:  # noqa: BLE001 - a failed store is counted, never raised
                self._failed("put", exc)
            return
        task = asyncio.get_running_loop().create_task(
            self._store(result, answer, policy, after))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(self, result: Lookup, answer: Answer, policy: CachePolicy,
                     after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait((after,))
            if result.hit is not None:
                return
        entry = self._entry(result, answer)
        try:
            await self._bounded("put", self.backend.put(entry, result.vector, policy.ttl_s),
                                max(1.0, policy.lookup_timeout_ms / 1000))
            self.stats.stores += 1
        except Bypass:
            pass
        if result.probe is not None and self.bound is not None:
            await self._learn(result, result.probe, answer, policy)

    @staticmethod
    def _entry(result: Lookup, answer: Answer) -> Entry:
        key = result.key
        assert key is not None
        return Entry(os.urandom(16).hex(), key.exact, key.scope if result.vector is not None
                     else None, key.namespace, key.query or "", answer.to_bytes())

    async def _learn(self, result: Lookup, probe: tuple[Entry, float, float], fresh: Answer,
                     policy: CachePolicy) -> None:
        """Compare ``fresh`` with the probe's cached answer; the outcome goes to the bound
        (none when the embedder is busy or the entry is broken)."""
        assert self.bound is not None
        entry, sim, score = probe
        if self.embedding >= policy.max_pending_embeddings:
            return
        try:
            cached = Answer.from_stored(result.stored(entry))
        except (ValueError, KeyError):
            return
        self.embedding += 1
        try:
            right = await agree(cached, fresh, self.embed)
        finally:
            self.embedding -= 1
        if right is not None:
            self.bound.learn(result.group, entry.id, sim, score, right, entry.namespace)

    async def drain(self) -> None:
        """Wait for pending lookups and stores (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def purge(self, namespace: str) -> int:
        return await self.backend.purge(namespace)

    async def aclose(self) -> None:
        await self.drain()
        await self.backend.aclose()


def _fits(result: Lookup, entry: Entry) -> bool:
    """A cached answer longer than the request's max_tokens would not have been produced."""
    if result.max_tokens is None:
        return True
    n = result.stored(entry).get("completion_tokens")
    return n is None or n <= result.max_tokens
