"""``[admission]``: the settings of admission control (:mod:`gateway.concurrency` holds the
limiters that apply them, :mod:`gateway.stages.admission` the stage), reloaded live with
the policy."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from gateway.schema import bounded
from gateway.service_time import ServiceRates

__all__ = ["PRIORITY_RANK", "AdmissionPolicy", "Priority"]

Priority = Literal["high", "normal", "low"]
PRIORITY_RANK: dict[str, int] = {"high": 0, "normal": 1, "low": 2}


@dataclass(frozen=True)
class AdmissionPolicy:
    enabled: bool = True
    limiter: Literal["static", "aimd"] = "static"
    #: Per upstream: the static limit, or where the adaptive one starts (requests in flight).
    max_concurrency: int = bounded(256, ge=1)
    min_concurrency: int = bounded(1, ge=1)
    max_limit: int = bounded(1024, ge=1)
    #: AIMD: a sample slower than this (ms) counts as a drop.
    latency_target_ms: float = bounded(10_000.0, ge=1)
    backoff: float = bounded(0.9, ge=0.1, le=0.99)
    #: Waiting requests per upstream beyond which new ones are shed at once.
    max_queue: int = bounded(256, ge=0)
    max_queue_wait_ms: float = bounded(1_000.0, ge=0)
    #: Bodies larger than this (bytes) go to the long-prompt lane.
    long_prompt_bytes: int = bounded(32_768, ge=1)
    long_lane_share: float = bounded(0.25, ge=0.01, le=1.0)
    #: The share of the slots ``low`` priority requests may hold at once (1: all of them).
    low_priority_share: float = bounded(1.0, ge=0.01, le=1.0)
    #: Whole gateway: requests in flight beyond this are shed at once (0: no limit).
    global_max_concurrency: int = bounded(0, ge=0)
    #: Per gateway key: requests in flight beyond this get 429 (0: no limit).
    per_key_max_concurrency: int = bounded(0, ge=0)
    #: With two gateway keys or more: the share of an upstream's slots (and of a model's
    #: own limit) one key may hold at once; beyond it, its request waits for one of its own
    #: to end (then is shed, ``key_share``), so one key cannot pin every slot (1: no cap).
    #: Without keys, or with one, nothing is capped (see gateway.entry_limits).
    per_key_share: float = bounded(0.5, ge=0.01, le=1.0)
    #: Per public model name: its own limit, on top of its upstreams' (queued the same way).
    model_max_concurrency: dict[str, int] = field(default_factory=dict)
    #: Priority by gateway key id (else "normal"). A client may ask a lower one with the
    #: ``x-gateway-priority`` header; a higher one only up to its ``key_max_priority``.
    key_priority: dict[str, Priority] = field(default_factory=dict)
    #: The highest priority a key may ask for with ``x-gateway-priority`` (key id ->
    #: level); a key not listed may ask its own or lower. Without gateway keys (one
    #: tenant), the header is honoured as sent.
    key_max_priority: dict[str, Priority] = field(default_factory=dict)
    #: Upstreams that know their capacity (the local engine: ``max_num_seqs``) admit to
    #: match it: an AIMD limit that starts at and never exceeds the capacity, and no queue
    #: (a request beyond it is shed at once, since the engine would only queue it).
    capacity_aware: bool = True
    #: Where the upstream reports its rates (the local engine), a request beyond its
    #: capacity waits while its predicted response time (wait, then service at the pace
    #: slots are held now) is at most 1 + this times its service time at those rates (a
    #: bounded slowdown); 0: never waits. 1.5: eight MT-Bench conversations (256 tokens) a
    #: few past the seats wait about one service time and are served; short requests of a
    #: flood, a queue several times the seats deep ahead, are shed.
    queue_slowdown: float = bounded(0.0, ge=0)

    def for_capacity(self, capacity: int | None,
                     rates: ServiceRates | None = None) -> AdmissionPolicy:
        """The policy an upstream of this ``capacity`` (None: unknown) is admitted under;
        with its measured ``rates``, requests may wait (``queue_slowdown``)."""
        if capacity is None or not self.capacity_aware:
            return self
        limit = max(self.min_concurrency, capacity)
        queue = self.max_queue if rates is not None and self.queue_slowdown else 0
        return dataclasses.replace(self, limiter="aimd", max_concurrency=limit,
                                   max_limit=limit, max_queue=queue)
