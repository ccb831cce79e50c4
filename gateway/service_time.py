"""A request's predicted service time on an engine, and its predicted wait for a seat.

The local engine measures its rates at start-up (local_engine.calibrate: ms per prompt token
of a prefill, ms per output token with its latency-bounded batch full) and reports them on
/healthz. A request's service time is then its prompt's prefill plus ``max_tokens`` decode
steps (the engine's ``default_max_tokens`` when the request names none): an upper bound,
since an answer may end sooner, but the same bound for every request, so comparing one
request's wait to its own service time stays fair between them.

Its wait is predicted by list scheduling: each seat frees when its request's predicted
remaining time runs out, and each request queued ahead takes the first seat to free
(Graham, "Bounds on Multiprocessing Timing Anomalies", 1969). :mod:`gateway.concurrency`
admits a waiting request while its predicted response time (that wait, then its service at
the pace slots are held now) stays within ``1 + queue_slowdown`` times its service time at
the measured rates: a *bounded slowdown* (response time over service time; Feitelson et al.,
"Theory and Practice in Parallel Job Scheduling", 1997), so a long answer may wait for a seat
while a short one is shed at once, and nothing waits while the batch alone already slows
answers past the bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["BYTES_PER_TOKEN", "ServiceRates", "Work", "predicted_wait_ms", "work_of"]

#: Request body bytes per prompt token, for a prediction that must not tokenize: about 4
#: bytes of English text per token (OpenAI's rule of thumb), JSON overhead included.
BYTES_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Work:
    """What a request asks of an engine: ``prompt_tokens`` (estimated) and ``max_tokens``
    (None: the engine's default)."""

    prompt_tokens: int
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ServiceRates:
    """An engine's measured rates (ms per token) and its default ``max_tokens``."""

    prefill_ms_per_token: float
    decode_ms_per_token: float
    default_max_tokens: int = 512

    @classmethod
    def from_health(cls, rates: object, default_max_tokens: int) -> ServiceRates | None:
        """From /healthz's ``rates`` object (local_engine.calibrate.Calibration.rates);
        None when it is missing or malformed."""
        if not isinstance(rates, Mapping):
            return None
        prefill, decode = rates.get("prefill_ms_per_token"), rates.get("decode_ms_per_token")
        if not all(isinstance(v, int | float) and v > 0 for v in (prefill, decode)):
            return None
        return cls(float(prefill), float(decode), default_max_tokens)  # type: ignore[arg-type]

    def service_ms(self, work: Work) -> float:
        """Predicted time (ms) from first seat to last token: prefill plus ``max_tokens``
        decode steps."""
        out = self.default_max_tokens if work.max_tokens is None else work.max_tokens
        return work.prompt_tokens * self.prefill_ms_per_token + out * self.decode_ms_per_token


def work_of(body: Mapping[str, Any], raw_bytes: int) -> Work:
    """A request's work from its parsed body (Chat Completions' ``max_completion_tokens`` or
    ``max_tokens``, Messages' ``max_tokens``, Responses' ``max_output_tokens``) and its size
    in bytes (prompt tokens at ``BYTES_PER_TOKEN``)."""
    out = body.get("max_completion_tokens") or body.get("max_tokens") \
        or body.get("max_output_tokens")
    return Work(raw_bytes // BYTES_PER_TOKEN,
                out if isinstance(out, int) and not isinstance(out, bool) and out > 0 else None)


def predicted_wait_ms(remaining_ms: Iterable[float], queued_ms: Iterable[float],
                      seats: int) -> float:
    """When (ms from now) a seat frees for one more request: ``remaining_ms``, the running
    requests' predicted remaining times; ``queued_ms``, the service times of those queued
    ahead of it, in order, each taking the first seat to free; ``seats``, how many run at
    once."""
    if seats < 1:
        return float("inf")
    running = sorted(max(0.0, ms) for ms in remaining_ms)
    # more running than seats (a limit just lowered): seats free as the surplus ends
    free = running[max(0, len(running) - seats):] + [0.0] * max(0, seats - len(running))
    heapq.heapify(free)
    for ms in queued_ms:
        heapq.heappush(free, heapq.heappop(free) + ms)
    return free[0]
