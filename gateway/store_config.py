"""``[cache]`` and ``[responses]`` of the gateway config: where the response cache and the
stored responses live, and their bounds (part of :mod:`gateway.config`, which re-exports
them; what the cache does per request is in the policy).

Both are shared by tenants (gateway keys) in process memory; ``key_share`` bounds what one
key may hold, so that one key's writes never evict another's entries
(:mod:`gateway.tenant_lru`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from gateway.schema import bounded

__all__ = ["CacheConfig", "ResponsesConfig", "checked_redis_url", "key_share"]


def checked_redis_url(url: str | None, env: str | None) -> str:
    """``url``, or the value of the environment variable ``env`` when one is named; raises
    ValueError when that is unset or either is not a Redis URL (the value is never quoted:
    it may hold a password)."""
    if env is not None:
        url = os.environ.get(env)
        if not url:
            raise ValueError(f"redis_url_env: the environment variable {env} is not set")
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url_env: {env} must hold a URL starting with redis://, "
                             "rediss:// or unix://")
    if url is None or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"redis_url must start with redis://, rediss:// or unix://, "
                         f"got {url!r}")
    return url


def key_share(configured: float | None, keys: int) -> float:
    """One gateway key's share of a store: ``configured``, else ``1 / keys`` (the whole
    store without keys): shares that add up to 1, so no key ever evicts another's."""
    return configured if configured is not None else 1.0 / max(1, keys)


@dataclass(frozen=True)
class CacheConfig:
    """Where the response cache lives (what it does per request is in the policy)."""

    enabled: bool = False
    #: "memory": in-process (per replica); "redis": RedisVL on Redis Stack >= 7.2 / Redis 8.
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: Environment variable holding the URL instead (one with a password, from a secret:
    #: then it never sits in this file); it must be set when the gateway starts.
    redis_url_env: str | None = None
    #: Key prefix (and index name) in Redis.
    prefix: str = "gwcache:"
    #: memory backend bounds (LRU beyond either).
    max_entries: int = bounded(100_000, ge=1)
    max_bytes: int = bounded(512 * 1024 * 1024, ge=1024)
    #: memory backend: the share of max_entries and max_bytes one gateway key's entries
    #: (all its namespaces) may hold, its own least recently used evicted beyond it. Unset:
    #: 1 / the number of keys (no key evicts another's; the whole cache without keys).
    #: Higher lets keys use room others leave idle: a full cache then evicts from the key
    #: holding the most.
    key_share: float | None = bounded(None, ge=0.001, le=1.0)
    #: Load the embedding model for the semantic layer (else exact matches only).
    semantic: bool = True

    def __post_init__(self) -> None:
        env = self.redis_url_env if self.backend == "redis" else None  # else never used
        object.__setattr__(self, "redis_url", checked_redis_url(self.redis_url, env))


@dataclass(frozen=True)
class ResponsesConfig:
    """Where ``/v1/responses`` keeps the responses it may be asked for again
    (``previous_response_id``, ``GET /v1/responses/{id}``)."""

    #: "memory": in-process (per replica; LRU beyond ``max_bytes``); "redis": shared.
    #: Default: the cache's Redis when ``cache.backend = "redis"``, else memory.
    store: Literal["memory", "redis"] | None = None
    #: Unset: the cache's Redis URL.
    redis_url: str | None = None
    redis_url_env: str | None = None
    prefix: str = "gwresp:"
    #: How long a stored response stays retrievable (seconds; OpenAI keeps 30 days).
    ttl_s: int = bounded(7 * 24 * 3600, ge=1)
    max_bytes: int = bounded(256 * 1024 * 1024, ge=1024)
    #: memory store: the share of max_bytes one gateway key's responses may hold, its own
    #: least recently used evicted beyond it. Unset: 1 / the number of keys (as
    #: ``cache.key_share``).
    key_share: float | None = bounded(None, ge=0.001, le=1.0)

    def __post_init__(self) -> None:
        if self.redis_url is not None or self.redis_url_env is not None:
            object.__setattr__(self, "redis_url",
                               checked_redis_url(self.redis_url, self.redis_url_env))
