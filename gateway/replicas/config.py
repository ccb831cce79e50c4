"""``[upstreams.NAME.pool]``: how a replica pool routes, watches and ejects its replicas
(the replicas themselves: ``replicas = [...]`` or ``discover = "..."`` on the upstream)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gateway.schema import bounded

__all__ = ["OutlierConfig", "PoolConfig"]


@dataclass(frozen=True)
class OutlierConfig:
    """Envoy's outlier detection: ``consecutive_errors`` failures in a row (connection
    refused or dropped, 5xx, a failed /healthz) eject a replica for ``base_ejection_s``
    times the number of times it was ejected, at most ``max_ejection_s``; never more than
    ``max_ejection_percent`` of the pool at once (at least one). Back, it takes a share of
    the load growing from 10% to all of it over ``ramp_s`` (Envoy's slow start)."""

    consecutive_errors: int = bounded(3, ge=1)
    base_ejection_s: float = bounded(10.0, ge=0.0)
    max_ejection_s: float = bounded(300.0, ge=0.0)
    max_ejection_percent: int = bounded(50, ge=0, le=100)
    ramp_s: float = bounded(30.0, ge=0.0)


@dataclass(frozen=True)
class PoolConfig:
    """A pool's routing (gateway.replicas.routing) and health checks."""

    routing: Literal["round_robin", "least_load", "prefix", "prefix_precise"] = "prefix"
    #: Route to the replica holding the longest prefix when it covers more than this share
    #: of the prompt (SGLang's router: 0.3 or 0.5 by version); else to the least loaded.
    cache_threshold: float = bounded(0.5, ge=0.0, le=1.0)
    #: The pool is imbalanced (least loaded replica first, whatever it holds) when the most
    #: and least loaded differ by more than this many requests and by this factor. SGLang's
    #: router uses 32-64 requests and 1.1-1.5x, for GPU servers' batches; 4 suits batches
    #: of 8-32 (a CPU engine's; bench/replicas.py: imbalance 1.03 at 4 replicas).
    balance_abs_threshold: float = bounded(4.0, ge=0.0)
    balance_rel_threshold: float = bounded(1.5, ge=1.0)
    #: ``prefix``: bytes a block of the approximate index covers, and the KV cache each
    #: replica holds (tokens; a replica that reports its KV blocks in /healthz overrides it)
    #: at ``bytes_per_token`` bytes a token: the index's LRU bound.
    block_bytes: int = bounded(128, ge=16)
    kv_tokens: int = bounded(23_296, ge=16)
    bytes_per_token: float = bounded(4.0, ge=0.5)
    #: ``prefix_precise``: the replicas' model, whose tokenizer and chat template the gateway
    #: applies to compute the engine's block hashes ("smollm2", a model folder).
    tokenizer: str = "smollm2"
    #: A sent request's blocks count as held until the engine reports them (s).
    pending_s: float = bounded(2.0, ge=0.0)
    #: How often each replica's /kv_events (prefix_precise) and /healthz are read (s).
    events_interval_s: float = bounded(0.1, ge=0.01)
    health_interval_s: float = bounded(2.0, ge=0.05)
    health_path: str = "/healthz"
    #: ``discover``: how often its DNS name is resolved again (s).
    discover_interval_s: float = bounded(10.0, ge=0.1)
    outlier: OutlierConfig = field(default_factory=OutlierConfig)
