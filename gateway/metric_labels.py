"""The label values the gateway knows before any traffic, which
:class:`gateway.metrics.Metrics` starts at 0 so that every series the dashboard and the
alert rules read exists from start-up.

One tuple per label, named after its metric; each says what sets the label, so that a new
value is added here too.
"""

from __future__ import annotations

__all__ = [
    "BOUND_DECISIONS", "BOUND_OUTCOMES", "CACHE_FAILURE_OPS", "CACHE_LOOKUPS", "COMPRESSION_OUTCOMES", "ERROR_TYPES",
    "LATE_HIT_OUTCOMES", "RATE_LIMIT_RESULTS", "RATE_LIMIT_STORES_LOCAL",
    "RATE_LIMIT_STORES_REDIS", "RELOAD_RESULTS", "SHED_REASONS", "STATUSES", "TOKEN_KINDS"
]

#: gateway_requests_total{status}: "200" only. The dashboard groups by status but selects
#: none, and the alert rules read failures and sheds from gateway_errors_total and
#: gateway_shed_total, so one status per (route, model) gives every panel and rule its 0;
#: an error status per pair would multiply the series for no query.
STATUSES = ("200",)
#: gateway_tokens_total{kind}: the RequestRecord counts :meth:`Metrics.observe` adds, in
#: its order (prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens).
TOKEN_KINDS = ("prompt", "completion", "cached", "cache_write")
#: gateway_errors_total{type}: the ``type`` of each error in gateway.errors (the base's
#: ``server_error`` included; RateLimited's is the limit that refused: requests or tokens).
#: The rules' error ratio leaves out the client's mistakes and overloaded_error; the rest
#: are its numerator. An upstream's own error type passes through as it is, when seen.
ERROR_TYPES = ("invalid_request_error", "authentication_error", "permission_error",
               "upstream_error", "overloaded_error", "requests", "tokens", "server_error")
#: gateway_shed_total{reason}: gateway.concurrency's Shed reasons and the dispatcher's
#: breaker_open. The degraded answers' labels (``cache:REASON``, ``compressed:REASON``,
#: ``rerouted:REASON``) depend on the policy's degraded actions and appear when seen.
SHED_REASONS = ("queue_full", "queue_timeout", "priority_evicted", "breaker_open")
#: gateway_compression_total{outcome}: compressed, or the compress stage's skip reasons
#: (gateway.stages.compress, and gateway.compression.gate's decisions).
COMPRESSION_OUTCOMES = ("compressed", "client_off", "short", "nothing_to_compress",
                        "no_prefill_rate", "not_worth_it", "no_gain", "error")
#: gateway_rate_limit_total{store}: who decides (gateway.ratelimit.limiter): Redis, and the
#: in-process fallback while it is away, when one is configured; else the process alone.
RATE_LIMIT_STORES_REDIS = ("redis", "fallback")
RATE_LIMIT_STORES_LOCAL = ("local",)
#: gateway_rate_limit_total{result}: allowed, or the limit that refused.
RATE_LIMIT_RESULTS = ("allowed", "requests", "tokens")
#: gateway_cache_lookups_total{result,layer}: what the cache stage counts (a miss and a
#: bypass have no layer).
CACHE_LOOKUPS = (("hit", "exact"), ("hit", "semantic"), ("miss", ""), ("bypass", ""))
#: gateway_cache_failures_total{op}: the cache's backend calls and embedding steps
#: (gateway.cache.cache).
CACHE_FAILURE_OPS = ("get", "search", "put", "semantic", "verify", "embed", "embed_busy")
#: gateway_cache_late_hits_total{outcome}.
LATE_HIT_OUTCOMES = ("served", "ignored", "too_late")
#: gateway_cache_bound_decisions_total{decision}: gateway.cache.bound.Decision.
BOUND_DECISIONS = ("serve", "explore", "miss")
#: gateway_cache_bound_outcomes_total{outcome}: a compared answer right or wrong.
BOUND_OUTCOMES = ("right", "wrong")
#: gateway_policy_reloads_total{result}.
RELOAD_RESULTS = ("ok", "rejected")
