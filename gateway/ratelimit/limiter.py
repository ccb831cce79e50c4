"""Which store decides a request's rate limits: Redis when configured and answering, else
the in-process GCRA.

Every Redis call is bounded by the policy's ``redis_timeout_ms``. A call that fails or
times out makes this process decide alone (verdicts labelled ``fallback``) for
``redis_retry_ms``; then the next request tries Redis again, and so on until it answers.
Each outage is logged once when it starts (``rate_limit_redis_down``) and once when it ends
(``rate_limit_redis_restored``, with its length and the decisions made meanwhile); no
request fails for it. The fallback holds the same limits, per process: N replicas allow up
to N times a key's limit while Redis is away.

The local buckets shadow Redis: what Redis admits is charged to them too (capped at one
period), so when Redis goes away mid-burst this process goes on from its own recent
traffic instead of from full buckets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import structlog
from redis.exceptions import RedisError

from gateway.config import Config
from gateway.ratelimit.gcra import Bucket, LocalGCRA, Verdict
from gateway.ratelimit.policy import RateLimitPolicy
from gateway.ratelimit.redis_gcra import RedisGCRA

__all__ = ["RateLimiter"]

log = structlog.get_logger("gateway.ratelimit")


class RateLimiter:
    """Kept by the gateway across policy reloads (its buckets and its Redis connection);
    the stage passes the policy it runs under to every call. Event-loop thread only."""

    def __init__(self, redis: RedisGCRA | None = None, local: LocalGCRA | None = None) -> None:
        self.redis = redis
        self.local = local or LocalGCRA()
        #: When the current outage began (monotonic s), or None while Redis answers.
        self.down_since: float | None = None
        self._retry_at = 0.0
        self._fallbacks = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(cls, config: Config) -> RateLimiter:
        """Redis at ``[rate_limits] redis_url``, else the cache's Redis when the cache lives
        in one, else in-process only."""
        url = config.rate_limits.redis_url
        if url is None and config.cache.enabled and config.cache.backend == "redis":
            url = config.cache.redis_url
        return cls(RedisGCRA(url, config.rate_limits.prefix) if url else None)

    def check_here(self, buckets: Sequence[Bucket]) -> Verdict | None:
        """:meth:`check` when this process decides alone (no Redis configured, or Redis down
        and not yet due for a retry), without a coroutine; else None (ask :meth:`check`)."""
        if self.redis is None:
            return self.local.decide(buckets)
        if self.down_since is not None and time.monotonic() < self._retry_at:
            return self._fallback(buckets)
        return None

    async def check(self, buckets: Sequence[Bucket], policy: RateLimitPolicy) -> Verdict:
        """Charge the request to ``buckets``, all or none; never raises for Redis."""
        verdict = self.check_here(buckets)
        if verdict is not None:
            return verdict
        assert self.redis is not None
        try:
            async with asyncio.timeout(policy.redis_timeout_ms / 1000):
                verdict = await self.redis.decide(buckets)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc, policy)
            return self._fallback(buckets)
        if self.down_since is not None:
            log.info("rate_limit_redis_restored", fallback_decisions=self._fallbacks,
                     down_s=round(time.monotonic() - self.down_since, 3))
            self.down_since = None
        if verdict.allowed:
            self.local.charge(buckets, cap=True)
        return verdict

    def settle(self, buckets: Sequence[Bucket], store: str, policy: RateLimitPolicy) -> None:
        """Add each bucket's cost (the actual usage minus what was reserved; negative: a
        refund) where the request was charged, in the background."""
        self.local.charge(buckets, cap=False)
        if store == "redis" and self.redis is not None and self.down_since is None:
            task = asyncio.create_task(self._settle(self.redis, buckets, policy))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _settle(self, redis: RedisGCRA, buckets: Sequence[Bucket],
                      policy: RateLimitPolicy) -> None:
        # Off the response path, so a longer bound than a decision's; a lost settlement
        # leaves the reservation standing (the local shadow has it).
        try:
            async with asyncio.timeout(max(0.1, 10 * policy.redis_timeout_ms / 1000)):
                await redis.decide(buckets, settle=True)
        except (RedisError, OSError, TimeoutError) as exc:
            log.debug("rate_limit_settle_failed", error=repr(exc))

    def _failed(self, exc: BaseException, policy: RateLimitPolicy) -> None:
        now = time.monotonic()
        self._retry_at = now + policy.redis_retry_ms / 1000
        if self.down_since is None:
            self.down_since = now
            self._fallbacks = 0
            log.warning("rate_limit_redis_down", error=repr(exc),
                        retry_ms=policy.redis_retry_ms)

    def _fallback(self, buckets: Sequence[Bucket]) -> Verdict:
        self._fallbacks += 1
        return self.local.decide(buckets, "fallback")

    async def drain(self) -> None:
        """Wait for the settlements under way (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.redis is not None:
            await self.redis.aclose()
