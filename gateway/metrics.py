"""Prometheus metrics for the request path (one registry per gateway instance, no globals).

Histograms are in seconds (Prometheus convention); the log line carries the same figures in
ms. Per-request series are plain counters that :class:`RequestCollector` turns into metric
families at scrape time: prometheus-client's own Histogram takes a lock per bucket update,
which cost ~25 us of the gateway's ~55 us of per-request work (the whole request path runs
on one event-loop thread, so no lock is needed). prometheus-client still does the exposition.

Every series the Grafana dashboard and the alert rules (deploy/) read exists from start-up,
at 0 for each label value the gateway knows before any traffic (:meth:`Metrics.start_at_zero`
and :mod:`gateway.metric_labels`), so that a panel or a ``rate()`` alert reads 0, not "no data"
(https://prometheus.io/docs/practices/instrumentation/#avoid-missing-metrics).

Every label value comes from a bounded set, whatever the traffic (issue 45: a label per
raw path let unauthenticated requests grow /metrics without bound): routes are the model
endpoints', ``passthrough`` or ``unknown``; models the config's (a family by pattern under
its pattern's name) or ``other``; an upstream's error type a known one or ``other``; a 401
only counts in gateway_refused_requests_total (see :mod:`gateway.metric_labels`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.histograms import LATENCY_BUCKETS, OVERHEAD_BUCKETS, Family
from gateway.metric_labels import (
    BOUND_DECISIONS,
    BOUND_OUTCOMES,
    CACHE_FAILURE_OPS,
    CACHE_LOOKUPS,
    COMPRESSION_OUTCOMES,
    ERROR_TYPES,
    LATE_HIT_OUTCOMES,
    OTHER,
    PASSTHROUGH,
    RATE_LIMIT_RESULTS,
    RATE_LIMIT_STORES_LOCAL,
    RATE_LIMIT_STORES_REDIS,
    REFUSED_REASONS,
    RELOAD_RESULTS,
    SHED_REASONS,
    STATUSES,
    TOKEN_KINDS,
    UNKNOWN,
    BoundedLabel,
    at_zero,
    error_type_label,
)
from gateway.requestlog import RequestRecord

if TYPE_CHECKING:
    from gateway.policy import RoutingPolicy


__all__ = ["Metrics", "RequestCollector"]

class RequestCollector(Collector):
    """The per-request metrics, kept as plain numbers and exported at scrape time."""

    def __init__(self) -> None:
        self.duration = Family("gateway_request_duration_seconds", "Arrival to last byte.",
                                ("route", "model"), LATENCY_BUCKETS)
        self.ttft = Family("gateway_ttft_seconds", "Streaming: arrival to first event.",
                            ("model",), LATENCY_BUCKETS)
        self.upstream = Family("gateway_upstream_duration_seconds",
                                "First upstream attempt to last upstream byte.", ("upstream",),
                                LATENCY_BUCKETS)
        self.queue_wait = Family("gateway_queue_wait_seconds",
                                  "Time queued for an admission slot (requests that queued).",
                                  ("upstream",), LATENCY_BUCKETS)
        self.overhead = Family("gateway_overhead_seconds",
                                "Total minus upstream time: what the gateway added.", ("route",),
                                OVERHEAD_BUCKETS)
        # (route, model, status) -> count; (model, kind) -> tokens; route -> count
        self.requests: dict[tuple[str, str, str], int] = {}
        self.tokens: dict[tuple[str, str], int] = {}
        self.retries: dict[str, int] = {}
        self.cancelled: dict[str, int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.shed: dict[tuple[str, str], int] = {}
        # (model, outcome: "compressed" or the skip reason) -> count; model -> tokens saved
        self.compression: dict[tuple[str, str], int] = {}
        self.compression_saved: dict[str, int] = {}
        # (store: redis | local | fallback, result: allowed | requests | tokens) -> count
        self.rate_limit: dict[tuple[str, str], int] = {}
        self.compress_time = Family("gateway_compress_seconds",
                                     "The compress stage's compressor time.", ("model",),
                                     LATENCY_BUCKETS)

    def collect(self) -> Iterator[Metric]:
        yield from (f.collect() for f in (self.duration, self.ttft, self.upstream, self.overhead,
                                          self.queue_wait, self.compress_time))
        series: tuple[tuple[str, str, list[str], dict[Any, int]], ...] = (
            ("gateway_requests", "Requests by route, served model and status.",
             ["route", "model", "status"], self.requests),
            ("gateway_tokens", ("Tokens upstreams billed by served model and kind (prompt, "
                                "completion, cached and cache_write: the provider's prompt "
                                "cache); cache hits and coalesced followers add none."),
             ["model", "kind"], self.tokens),
            ("gateway_retries", "Upstream attempts beyond the first.", ["route"],
             self.retries),
            ("gateway_cancelled_requests", "Requests the client abandoned before completion.",
             ["route"], self.cancelled),
            ("gateway_errors", "Failed requests by error type.", ["route", "type"],
             self.errors),
            ("gateway_shed", "Requests shed or rerouted (degraded mode) by reason.",
             ["route", "reason"], self.shed),
            ("gateway_compression", ("Chat requests the compress stage saw, by served model "
                                     "and outcome (compressed, or why it skipped)."),
             ["model", "outcome"], self.compression),
            ("gateway_compression_saved_tokens", "Prompt tokens removed by compression.",
             ["model"], self.compression_saved),
            ("gateway_rate_limit", ("Rate-limit decisions by store (redis; local: no Redis "
                                    "configured; fallback: Redis down or slow, decided in "
                                    "process) and result (allowed, or the limit that "
                                    "refused: requests, tokens)."),
             ["store", "result"], self.rate_limit),
        )
        for name, doc, labels, values in series:
            family = CounterMetricFamily(name, doc, labels=labels)
            for key, count in list(values.items()):
                family.add_metric(list(key) if isinstance(key, tuple) else [key], count)
            yield family


class _GuardCollector(Collector):
    def __init__(self, dispatcher: Any):
        self._dispatcher = dispatcher

    def collect(self) -> Iterator[Metric]:
        gauges: dict[str, tuple[str, Callable[[Any], float]]] = {
            "gateway_upstream_in_flight": ("Requests holding an admission slot.",
                                           lambda g: g.limiter.in_flight),
            "gateway_upstream_concurrency_limit": ("Current admission limit.",
                                                   lambda g: g.limiter.limit),
            "gateway_upstream_queue_depth": ("Requests waiting for a slot.",
                                             lambda g: g.limiter.queue_depth),
            "gateway_upstream_service_ms": ("Mean slot hold time (EWMA), ms.",
                                            lambda g: g.limiter.service_ms),
            "gateway_breaker_state": ("Circuit breaker: 0 closed, 1 half-open, 2 open.",
                                      lambda g: int(g.breaker.state)),
        }
        for name, (doc, read) in gauges.items():
            family = GaugeMetricFamily(name, doc, labels=["upstream"])
            for upstream, guard in self._dispatcher.guards.items():
                family.add_metric([upstream], read(guard))
            yield family


class _CacheCollector(Collector):
    def __init__(self, cache: Any):
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        stats = self._cache.stats
        lookups = CounterMetricFamily("gateway_cache_lookups", "Cache lookups by result "
                                      "(hit, miss, bypass) and layer.",
                                      labels=["result", "layer"])
        for (result, layer), n in at_zero(CACHE_LOOKUPS, stats.lookups).items():
            lookups.add_metric([result, layer], n)
        yield lookups
        failures = CounterMetricFamily("gateway_cache_failures", "Cache backend calls that "
                                       "failed or timed out (the request bypassed).",
                                       labels=["op"])
        for op, n in at_zero(CACHE_FAILURE_OPS, stats.failures).items():
            failures.add_metric([op], n)
        yield failures
        yield CounterMetricFamily("gateway_cache_stores", "Answers stored.",
                                  value=stats.stores)
        yield CounterMetricFamily("gateway_cache_over_budget", "Requests sent upstream "
                                  "before their semantic lookup ended (lookup_budget_ms).",
                                  value=stats.over_budget)
        late = CounterMetricFamily("gateway_cache_late_hits", "Semantic hits found past the "
                                   "lookup budget: served (the upstream call cancelled), "
                                   "ignored (the upstream may bill it), too_late (the "
                                   "upstream answered first).", labels=["outcome"])
        for outcome, n in at_zero(LATE_HIT_OUTCOMES, stats.late_hits).items():
            late.add_metric([outcome], n)
        yield late
        bound = self._cache.bound
        for name, doc, label, known, counts in (
                ("decisions", "Semantic candidates by the error bound's decision.",
                 "decision", BOUND_DECISIONS,
                 bound.stats.decisions if bound else {}),
                ("outcomes", "Fresh answers compared with a candidate's cached one.",
                 "outcome", BOUND_OUTCOMES, {("right" if k else "wrong"): n for k, n in (
                     bound.stats.learnt if bound else {}).items()})):
            family = CounterMetricFamily(f"gateway_cache_bound_{name}", doc, labels=[label])
            for value, n in at_zero(known, counts).items():
                family.add_metric([value], n)
            yield family


class _RoutingCollector(Collector):
    """The routers' decisions, and 0 for each (router, tier) the current policy has: read
    at scrape time, so a router that a policy reload adds reads 0 at once."""

    def __init__(self, routing: Any, policy: Callable[[], RoutingPolicy]):
        self._routing = routing
        self._policy = policy

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily("gateway_route_decisions", "Routing decisions by "
                                        "router and chosen tier.", labels=["router", "tier"])
        policy = self._policy()
        known = [(name, tier) for name, router in policy.routers.items()
                 for tier in (router.weak, router.strong)] if policy.enabled else []
        for (router, tier), n in at_zero(known, self._routing.decisions).items():
            decisions.add_metric([router, tier], n)
        yield decisions


class _Series:
    """The per-request series of one (route, model, status, upstream) combination."""

    __slots__ = ("duration", "overhead", "requests_key", "route", "tokens_keys", "ttft",
                 "upstream")

    def __init__(self, c: RequestCollector, route: str, model: str, status: int,
                 upstream: str):
        self.route = route
        self.requests_key = (route, model, str(status))
        self.duration = c.duration.get(route, model)
        self.overhead = c.overhead.get(route)
        self.ttft = c.ttft.get(model)
        self.upstream = c.upstream.get(upstream)
        self.tokens_keys = tuple((model, kind) for kind in TOKEN_KINDS)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.collector = RequestCollector()
        self.registry.register(self.collector)
        self._series: dict[tuple[str, str, int, str], _Series] = {}
        #: Requests being served; a plain int on the hot path, read at scrape time.
        self.in_flight = 0
        Gauge("gateway_in_flight_requests", "Requests being served.",
              registry=self.registry).set_function(lambda: self.in_flight)
        self.policy_reloads = Counter("gateway_policy_reloads", "Policy reload attempts.",
                                      ["result"], registry=self.registry)
        for result in RELOAD_RESULTS:
            self.policy_reloads.labels(result)
        self.refused = Counter("gateway_refused_requests", "Requests refused before any "
                               "route served them (no series of their own: see "
                               "gateway.metric_labels.REFUSED_REASONS).", ["reason"],
                               registry=self.registry)
        for reason in REFUSED_REASONS:
            self.refused.labels(reason)
        #: Route and model labels (start_at_zero adds): others count as unknown, other.
        self._routes, self._models = {PASSTHROUGH}, {"none"}
        self._shed = BoundedLabel(SHED_REASONS)

    def start_at_zero(self, *, routes: Iterable[str], models: Iterable[str],
                      upstreams: Iterable[str], rate_limit_redis: bool) -> None:
        """Start the per-request series at 0 for the label values known before any traffic
        (see the module docstring): ``routes``, the model endpoints' routes (e.g.
        ``/v1/chat/completions``); ``models``, every model label (ModelTable.metric_models;
        any other counts as ``other``); ``upstreams``, the upstream names;
        ``rate_limit_redis``, whether a Redis decides rate limits. Calling it again adds.

        Counters (one series per label set) get the known values' cross product: route x
        model x status (STATUSES), route x error type, route x shed reason, model x token
        kind, model x compression outcome, store x rate-limit result. Histograms (one
        series per bucket) only get the values the dashboard groups them by: the overhead by
        route, TTFT and compressor time by model, upstream time and queue wait by upstream;
        the request duration, which it sums over all labels, once per route with the model
        ``none`` (the label of answers no upstream served: cache hits, early errors).
        """
        c = self.collector
        routes, models = list(dict.fromkeys(routes)), list(dict.fromkeys(models))
        self._routes.update(routes)
        self._models.update(models)
        for route in routes:
            c.duration.get(route, "none")
            c.overhead.get(route)
            c.retries.setdefault(route, 0)
            c.cancelled.setdefault(route, 0)
            for model in models:
                for status in STATUSES:
                    c.requests.setdefault((route, model, status), 0)
            for error_type in ERROR_TYPES:
                c.errors.setdefault((route, error_type), 0)
            for reason in SHED_REASONS:
                c.shed.setdefault((route, reason), 0)
        for model in models:
            c.ttft.get(model)
            c.compress_time.get(model)
            c.compression_saved.setdefault(model, 0)
            for kind in TOKEN_KINDS:
                c.tokens.setdefault((model, kind), 0)
            for outcome in COMPRESSION_OUTCOMES:
                c.compression.setdefault((model, outcome), 0)
        for upstream in upstreams:
            c.upstream.get(upstream)
            c.queue_wait.get(upstream)
        stores = RATE_LIMIT_STORES_REDIS if rate_limit_redis else RATE_LIMIT_STORES_LOCAL
        for store in stores:
            for result in RATE_LIMIT_RESULTS:
                c.rate_limit.setdefault((store, result), 0)

    def watch_cache(self, cache: Any) -> None:
        """Export the response cache's counters (read at scrape time)."""
        self.registry.register(_CacheCollector(cache))

    def watch_routing(self, routing: Any, policy: Callable[[], RoutingPolicy]) -> None:
        """Export the routing stage's decision counters, and 0 for each (router, tier) of
        ``policy()``, the current routing policy (both read at scrape time)."""
        self.registry.register(_RoutingCollector(routing, policy))

    def watch_guards(self, dispatcher: Any) -> None:
        """Export each upstream's admission and breaker state (read at scrape time)."""
        self.registry.register(_GuardCollector(dispatcher))

    def observe(self, rec: RequestRecord) -> None:
        """Count one finished request (called once per request, on the event-loop thread)."""
        c = self.collector
        model = rec.model_label or rec.model_served or "none"
        key = (rec.route, model, rec.status, rec.upstream or "none")
        s = self._series.get(key)
        if s is None:
            s = self._new_series(key)
            if s is None:  # refused before any route served it: counted apart
                return
        c.requests[s.requests_key] = c.requests.get(s.requests_key, 0) + 1
        if rec.total_ms is not None:
            c.duration.observe(s.duration, rec.total_ms / 1000)
        if rec.overhead_ms is not None:
            c.overhead.observe(s.overhead, rec.overhead_ms / 1000)
        if rec.ttft_ms is not None:
            c.ttft.observe(s.ttft, rec.ttft_ms / 1000)
        if rec.upstream_ms is not None and rec.upstream:
            c.upstream.observe(s.upstream, rec.upstream_ms / 1000)
        billed = rec.cache != "hit" and rec.coalesced != "follower"  # else no upstream's
        for k, n in zip(s.tokens_keys, (rec.prompt_tokens, rec.completion_tokens,
                                        rec.cached_tokens, rec.cache_write_tokens), strict=True):
            if n and billed:
                c.tokens[k] = c.tokens.get(k, 0) + n
        if rec.queue_ms:
            c.queue_wait.observe(c.queue_wait.get(rec.upstream or "none"), rec.queue_ms / 1000)
        if rec.retries:
            c.retries[s.route] = c.retries.get(s.route, 0) + rec.retries
        if rec.cancelled:
            c.cancelled[s.route] = c.cancelled.get(s.route, 0) + 1
        if rec.error_type:
            k2 = (s.route, error_type_label(rec.error_type))
            c.errors[k2] = c.errors.get(k2, 0) + 1
        if rec.shed:
            k3 = (s.route, self._shed(rec.shed))
            c.shed[k3] = c.shed.get(k3, 0) + 1
        if rec.compress_skip or rec.compression:
            self._compression(rec)
        if rec.rate_limit:
            k4 = (rec.rate_limit, rec.rate_limited or "allowed")
            c.rate_limit[k4] = c.rate_limit.get(k4, 0) + 1

    def _new_series(self, key: tuple[str, str, int, str]) -> _Series | None:
        """The series of a label set first seen, bounded: a known route (else ``unknown``)
        and model (else ``other``), an HTTP status (else 0). Only bounded keys are kept: a
        new label set costs a lookup more, not a series. None for a 401 (counted apart)."""
        route, model, status, upstream = key
        if status == 401:
            self.refused.labels("unauthenticated").inc()
            return None
        bounded = (route if route in self._routes else UNKNOWN,
                   model if model in self._models else OTHER,
                   status if 100 <= status <= 599 else 0, upstream)
        s = self._series.get(bounded)
        if s is None:
            s = self._series[bounded] = _Series(self.collector, *bounded)
        return s

    def refuse(self, reason: str) -> None:
        """Count a request refused before any route served it (``reason``: one of
        :data:`~gateway.metric_labels.REFUSED_REASONS`)."""
        self.refused.labels(reason).inc()

    def _compression(self, rec: RequestRecord) -> None:
        model = rec.model_label or rec.model_served or "none"
        c, model = self.collector, model if model in self._models else OTHER
        key = (model, rec.compress_skip or "compressed")
        c.compression[key] = c.compression.get(key, 0) + 1
        if rec.compress_ms is not None:
            c.compress_time.observe(c.compress_time.get(model), rec.compress_ms / 1000)
        if rec.compression and rec.tokens_before and rec.tokens_after:
            saved = rec.tokens_before - rec.tokens_after
            c.compression_saved[model] = c.compression_saved.get(model, 0) + saved

    def render(self) -> bytes:
        return generate_latest(self.registry)
