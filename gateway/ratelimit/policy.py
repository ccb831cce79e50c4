"""The policy's ``[rate_limits]`` section: the ``rate_limit`` stage's limits.

::

    [rate_limits]
    default = { requests_per_minute = 600, tokens_per_minute = 200000 }

    [rate_limits.keys.team-a]
    requests_per_minute = 60
    tokens_per_minute = 40000
    models = { "gpt-4o" = { requests_per_minute = 10, tokens_per_minute = 10000 } }

A key listed under ``keys`` gets its own entry instead of ``default`` (whole: its
``models`` too); every other key, and requests without a key (no ``[[auth.keys]]``
configured), get ``default``. Where the gateway's Redis lives is in the gateway config
(``[rate_limits] redis_url``), not here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from gateway.schema import bounded

__all__ = ["KeyLimits", "Limits", "RateLimitPolicy"]


@dataclass(frozen=True)
class Limits:
    """Requests and tokens (prompt plus completion) per minute; 0: no limit."""

    requests_per_minute: int = bounded(0, ge=0)
    tokens_per_minute: int = bounded(0, ge=0)

    @property
    def any(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute)


@dataclass(frozen=True)
class KeyLimits:
    """One key's limits: over all its requests, and per public model name (``models``:
    each a limit of its own on this key's requests for that model, on top)."""

    requests_per_minute: int = bounded(0, ge=0)
    tokens_per_minute: int = bounded(0, ge=0)
    models: dict[str, Limits] = field(default_factory=dict)

    @property
    def whole(self) -> Limits:
        return Limits(self.requests_per_minute, self.tokens_per_minute)

    @property
    def any(self) -> bool:
        return self.whole.any or any(m.any for m in self.models.values())


@dataclass(frozen=True)
class RateLimitPolicy:
    """Rate limits per gateway key, held jointly by the gateway's replicas when they share
    a Redis (see gateway.stages.rate_limit). With no limit set anywhere, the stage is left
    out of the pipeline."""

    enabled: bool = True
    #: Every key not listed in ``keys``, and requests without a key.
    default: KeyLimits = field(default_factory=KeyLimits)
    #: Gateway key id -> its limits (replacing ``default``).
    keys: dict[str, KeyLimits] = field(default_factory=dict)
    #: Bound on each Redis call (ms); slower or failed -> the in-process limiter decides.
    redis_timeout_ms: float = bounded(5.0, ge=0.1, le=1_000.0)
    #: After a Redis failure, the in-process limiter decides alone this long (ms) before
    #: Redis is tried again, so an outage costs one timeout, not one per request.
    redis_retry_ms: float = bounded(1_000.0, ge=10.0, le=60_000.0)
    #: Tokens reserved for the completion when a request sets no ``max_tokens`` (settled
    #: with the actual usage once the answer is complete).
    default_completion_tokens: int = bounded(0, ge=0)

    def for_key(self, key_id: str | None) -> KeyLimits:
        """The limits that apply to ``key_id`` (None: no key)."""
        if key_id is None:
            return self.default
        return self.keys.get(key_id, self.default)

    def check_models(self, models: Collection[str]) -> None:
        """Raises ValueError when a per-model limit names a model no client can ask for
        (``models``: the configured public models and the router aliases): such a limit
        would never apply."""
        entries = [("default", self.default), *((f"keys.{k}", v) for k, v in self.keys.items())]
        for name, limits in entries:
            for model in limits.models:
                if model not in models:
                    raise ValueError(f"rate_limits.{name}.models: the model '{model}' is not "
                                     "configured on this gateway (nor a router alias)")

    @property
    def active(self) -> bool:
        """Whether any limit applies to any request."""
        return self.enabled and (self.default.any or any(k.any for k in self.keys.values()))
