"""The label values the gateway knows before any traffic, which
:class:`gateway.metrics.Metrics` starts at 0 so that every series the dashboard and the
alert rules read exists from start-up.

One tuple per label, named after its metric; each says what sets the label, so that a new
value is added here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

__all__ = [
    "BOUND_DECISIONS", "BOUND_OUTCOMES", "CACHE_FAILURE_OPS", "CACHE_LOOKUPS",
    "COMPRESSION_OUTCOMES", "ERROR_TYPES", "LATE_HIT_OUTCOMES", "OTHER", "PASSTHROUGH",
    "RATE_LIMIT_RESULTS", "RATE_LIMIT_STORES_LOCAL", "RATE_LIMIT_STORES_REDIS",
    "REFUSED_REASONS", "RELOAD_RESULTS", "SHED_REASONS", "STATUSES", "TOKEN_KINDS", "UNKNOWN",
    "BoundedLabel", "at_zero", "error_type_label",
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
#: are its numerator. An upstream's own error type is counted when it is one of
#: UPSTREAM_ERROR_TYPES, else as ``other`` (:func:`error_type_label`).
ERROR_TYPES = ("invalid_request_error", "authentication_error", "permission_error",
               "upstream_error", "overloaded_error", "requests", "tokens", "server_error")
#: gateway_requests_total{route} and the other ``route`` labels: a model endpoint's route
#: (``/v1/chat/completions``...: the gateway's own paths), ``passthrough`` for every
#: pass-through path (never the path: it holds object ids and is the client's to choose),
#: ``unknown`` for anything else. Never a raw path.
PASSTHROUGH = "passthrough"
UNKNOWN = "unknown"
#: A label value clamped: one traffic (an upstream's answer) chose and the gateway does not
#: know.
OTHER = "other"
#: gateway_refused_requests_total{reason}: requests refused before any route served them,
#: counted here only (no per-route series: a client without a key, or one trying random
#: paths, adds no series): ``unauthenticated`` (401), ``not_found`` (404: no such route, or
#: a pass-through path not allowed), ``method_not_allowed`` (405), ``bad_path`` (400: a
#: path without a canonical form, gateway.paths).
REFUSED_REASONS = ("unauthenticated", "not_found", "method_not_allowed", "bad_path")
#: gateway_errors_total{type}, beyond ERROR_TYPES: the error types the providers send
#: (OpenAI's, Anthropic's, and the Responses stream's error codes, which it reports in
#: place of a type); any other value an upstream sends counts as ``other``.
UPSTREAM_ERROR_TYPES = frozenset({
    "not_found_error", "rate_limit_error", "api_error", "billing_error", "timeout_error",
    "request_too_large", "insufficient_quota", "rate_limit_exceeded", "invalid_prompt",
    "server_error", "context_length_exceeded", "invalid_api_key", "error",
})
_ERROR_TYPES = frozenset(ERROR_TYPES) | UPSTREAM_ERROR_TYPES


def error_type_label(kind: str) -> str:
    """``kind`` as a gateway_errors_total ``type``: known (gateway.errors' types, the
    providers'), else ``other``."""
    return kind if kind in _ERROR_TYPES else OTHER


class BoundedLabel:
    """A label that code (not traffic) fills, bounded anyway: the ``known`` values, then
    at most ``extra`` others as first seen (short, lower-case ``a-z0-9_:`` words), then
    ``other``: a bug or a new reason cannot grow a series per request."""

    def __init__(self, known: tuple[str, ...], extra: int = 32) -> None:
        self._seen = set(known)
        self._room = extra

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if self._room > 0 and len(value) <= 64 and value.replace(":", "_").replace(
                "_", "a").isalnum() and value.islower():
            self._room -= 1
            self._seen.add(value)
            return value
        return OTHER


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


K = TypeVar("K")


def at_zero(known: Iterable[K], counts: Mapping[K, int]) -> dict[K, int]:
    """``counts`` with 0 for each of the ``known`` keys it lacks (known keys first): a
    collector's series from start-up."""
    return dict.fromkeys(known, 0) | dict(counts)
