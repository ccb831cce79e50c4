"""Prometheus metrics for the request path (one registry per gateway instance, no globals).

Histograms are in seconds (Prometheus convention); the log line carries the same figures in ms.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.requestlog import RequestRecord

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.015, 0.025,
                     0.05, 0.1, 0.25, 1.0)


class _Series(NamedTuple):
    requests: Any
    duration: Any
    overhead: Any
    ttft: Any
    upstream: Any
    tokens: tuple[Any, ...]


class Metrics:
    def __init__(self) -> None:
        self._cache: dict[tuple[str, str, int, str], _Series] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("gateway_requests", "Requests by route, served model and status.",
                                ["route", "model", "status"], registry=r)
        self.duration = Histogram("gateway_request_duration_seconds",
                                  "Arrival to last byte.", ["route", "model"],
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("gateway_ttft_seconds", "Streaming: arrival to first event.",
                              ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream = Histogram("gateway_upstream_duration_seconds",
                                  "First upstream attempt to last upstream byte.", ["upstream"],
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.overhead = Histogram("gateway_overhead_seconds",
                                  "Total minus upstream time: what the gateway added.",
                                  ["route"], buckets=_OVERHEAD_BUCKETS, registry=r)
        self.tokens = Counter("gateway_tokens", "Tokens by served model and kind.",
                              ["model", "kind"], registry=r)
        self.retries = Counter("gateway_retries", "Upstream attempts beyond the first.",
                               ["route"], registry=r)
        self.cancelled = Counter("gateway_cancelled_requests",
                                 "Requests the client abandoned before completion.", ["route"],
                                 registry=r)
        self.errors = Counter("gateway_errors", "Failed requests by error type.",
                              ["route", "type"], registry=r)
        #: Requests being served; a plain int on the hot path, read at scrape time.
        self.in_flight = 0
        Gauge("gateway_in_flight_requests", "Requests being served.",
              registry=r).set_function(lambda: self.in_flight)
        self.policy_reloads = Counter("gateway_policy_reloads", "Policy reload attempts.",
                                      ["result"], registry=r)

    def _series(self, rec: RequestRecord) -> _Series:
        # labels() takes a lock and builds tuples: too slow to call six times per request.
        key = (rec.route, rec.model_served or "none", rec.status, rec.upstream or "none")
        series = self._cache.get(key)
        if series is None:
            route, model, status, upstream = key
            series = _Series(
                self.requests.labels(route, model, str(status)),
                self.duration.labels(route, model),
                self.overhead.labels(route),
                self.ttft.labels(model),
                self.upstream.labels(upstream),
                tuple(self.tokens.labels(model, kind) for kind in ("prompt", "completion",
                                                                   "cached")),
            )
            self._cache[key] = series
        return series

    def observe(self, rec: RequestRecord) -> None:
        series = self._series(rec)
        series.requests.inc()
        if rec.total_ms is not None:
            series.duration.observe(rec.total_ms / 1000)
        if rec.overhead_ms is not None:
            series.overhead.observe(rec.overhead_ms / 1000)
        if rec.ttft_ms is not None:
            series.ttft.observe(rec.ttft_ms / 1000)
        if rec.upstream_ms is not None and rec.upstream:
            series.upstream.observe(rec.upstream_ms / 1000)
        for counter, n in zip(series.tokens, (rec.prompt_tokens, rec.completion_tokens,
                                              rec.cached_tokens), strict=True):
            if n:
                counter.inc(n)
        if rec.retries:
            self.retries.labels(rec.route).inc(rec.retries)
        if rec.cancelled:
            self.cancelled.labels(rec.route).inc()
        if rec.error_type:
            self.errors.labels(rec.route, rec.error_type).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
