"""A fresh gateway's /metrics, before any request, has every series the Grafana dashboard and
the alert rules read, at 0 for each label value the gateway knows at start-up, so a panel
or a ``rate()`` alert reads 0, not "no data" (Prometheus, "Avoid missing metrics":
https://prometheus.io/docs/practices/instrumentation/#avoid-missing-metrics).

The gateway is the one tests/deploy/test_metric_names.py sends traffic to (the cache, a
router, compression, admission, a breaker, rate limits), started and not called.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gateway import errors
from gateway.metric_labels import ERROR_TYPES
from tests.conftest import GatewayServer
from tests.deploy.promql import dashboard_exprs, exported_names, rule_exprs, selectors, selects
from tests.deploy.test_metric_names import (
    DECLARED_ONLY,
    POLICY_EXTRA,
    SYNTHETIC,
    gateway_queried,
    serve_a_bit_of_everything,
    start_gateway,
)
from tests.gateway.routing.test_routing import routing_policy

ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages",
          "/v1/messages/count_tokens", "/v1/responses"}
#: The configured models' targets' models (what ``model`` labels: the served model).
MODELS = {"fake-upstream-model", "x", "backup-model", "s", "k", "small-upstream",
          "large-upstream", "never"}
UPSTREAMS = {"fake", "backup", "dead", "short", "keyless"}
#: (metric, label) -> the values a fresh gateway has a series for, at 0.
KNOWN: dict[tuple[str, str], set[str]] = {
    ("gateway_requests_total", "route"): ROUTES,
    ("gateway_requests_total", "model"): MODELS,
    ("gateway_requests_total", "status"): {"200"},
    ("gateway_overhead_seconds_count", "route"): ROUTES,
    ("gateway_request_duration_seconds_count", "route"): ROUTES,
    ("gateway_retries_total", "route"): ROUTES,
    ("gateway_cancelled_requests_total", "route"): ROUTES,
    ("gateway_ttft_seconds_count", "model"): MODELS,
    ("gateway_upstream_duration_seconds_count", "upstream"): UPSTREAMS,
    ("gateway_queue_wait_seconds_count", "upstream"): UPSTREAMS,
    ("gateway_tokens_total", "model"): MODELS,
    ("gateway_tokens_total", "kind"): {"prompt", "completion", "cached", "cache_write"},
    ("gateway_errors_total", "route"): ROUTES,
    ("gateway_errors_total", "type"): {
        "invalid_request_error", "authentication_error", "permission_error",
        "upstream_error", "overloaded_error", "requests", "tokens", "server_error"},
    ("gateway_shed_total", "route"): ROUTES,
    ("gateway_shed_total", "reason"): {"queue_full", "queue_timeout", "priority_evicted",
                                       "breaker_open"},
    ("gateway_cache_lookups_total", "result"): {"hit", "miss", "bypass"},
    ("gateway_cache_lookups_total", "layer"): {"exact", "semantic", ""},
    ("gateway_cache_failures_total", "op"): {"get", "search", "put", "semantic", "verify",
                                             "embed", "embed_busy"},
    ("gateway_cache_late_hits_total", "outcome"): {"served", "ignored", "too_late"},
    ("gateway_route_decisions_total", "router"): {"auto"},
    ("gateway_route_decisions_total", "tier"): {"small", "large"},
    ("gateway_policy_reloads_total", "result"): {"ok", "rejected"},
    ("gateway_compression_total", "model"): MODELS,
    ("gateway_compression_total", "outcome"): {
        "compressed", "client_off", "short", "nothing_to_compress", "no_prefill_rate",
        "not_worth_it", "no_gain", "error"},
    ("gateway_compression_saved_tokens_total", "model"): MODELS,
    ("gateway_compress_seconds_count", "model"): MODELS,
    ("gateway_rate_limit_total", "store"): {"local"},  # no Redis configured
    ("gateway_rate_limit_total", "result"): {"allowed", "requests", "tokens"},
    ("gateway_breaker_state", "upstream"): UPSTREAMS,
    ("gateway_upstream_in_flight", "upstream"): UPSTREAMS,
}
#: Labels whose values are all known before any traffic: traffic adds no new value to them.
ENUMERATED = {("gateway_tokens_total", "kind"), ("gateway_shed_total", "reason"),
              ("gateway_cache_lookups_total", "result"), ("gateway_cache_lookups_total", "layer"),
              ("gateway_cache_failures_total", "op"), ("gateway_cache_late_hits_total", "outcome"),
              ("gateway_route_decisions_total", "router"),
              ("gateway_route_decisions_total", "tier"),
              ("gateway_policy_reloads_total", "result"),
              ("gateway_compression_total", "outcome"), ("gateway_rate_limit_total", "store"),
              ("gateway_rate_limit_total", "result"), ("gateway_errors_total", "type")}


def samples(gw: GatewayServer) -> list[Sample]:
    page = httpx.get(gw.url + "/metrics").text
    return [s for family in text_string_to_metric_families(page) for s in family.samples]


def values(found: list[Sample], metric: str, label: str) -> set[str]:
    return {s.labels.get(label, "") for s in found if s.name == metric}


@pytest.fixture
def fresh_gateway(make_gateway: Callable[..., GatewayServer], tmp_path: Path) -> GatewayServer:
    return start_gateway(make_gateway, tmp_path)


def test_a_fresh_gateway_exports_every_metric_the_dashboard_and_rules_query(
        fresh_gateway: GatewayServer) -> None:
    page = httpx.get(fresh_gateway.url + "/metrics").text
    sampled, declared = exported_names(page)
    wanted = gateway_queried()
    # A sample each, not only a HELP/TYPE line: "no data" is what a family without one reads.
    missing = {name: where for name, where in wanted.items()
               if name not in sampled and name not in DECLARED_ONLY}
    assert not missing, f"queried but without a series before any traffic: {missing}"
    assert DECLARED_ONLY <= declared
    assert len(wanted) > 25


def test_every_selector_they_query_selects_a_series_of_a_fresh_gateway(
        fresh_gateway: GatewayServer) -> None:
    found = samples(fresh_gateway)
    empty = []
    for where, expr in [*dashboard_exprs(), *rule_exprs()]:
        for name, matchers in selectors(expr):
            if name.startswith("engine_") or name in SYNTHETIC | DECLARED_ONLY:
                continue
            if not any(s.name == name and selects(matchers, s.labels) for s in found):
                empty.append(f"{where}: {name}{{{matchers}}}")
    assert not empty, "selects nothing before any traffic:\n" + "\n".join(empty)


def test_a_fresh_gateway_has_a_zero_series_for_each_label_value_it_knows(
        fresh_gateway: GatewayServer) -> None:
    found = samples(fresh_gateway)
    for (metric, label), expected in KNOWN.items():
        assert values(found, metric, label) == expected, (metric, label)
    counts = [s for s in found if s.name.endswith(("_total", "_count", "_sum"))]
    assert counts and all(s.value == 0 for s in counts)
    assert all(s.value == 0 for s in found if s.name == "gateway_breaker_state")  # closed
    # Counters are the cross product of the known values; histograms only by the label the
    # dashboard groups them by (the duration: per route, model "none").
    assert len([s for s in found if s.name == "gateway_requests_total"]) == len(ROUTES) * 8
    assert len([s for s in found if s.name == "gateway_errors_total"]) == len(ROUTES) * 8
    assert {(s.labels["route"], s.labels["model"]) for s in found
            if s.name == "gateway_request_duration_seconds_count"} == {
        (route, "none") for route in ROUTES}


def test_a_router_a_policy_reload_adds_reads_zero_at_once(
        fresh_gateway: GatewayServer, tmp_path: Path) -> None:
    artifact = tmp_path / "tiny.npz"  # start_gateway's
    tiers = 'small = ["small-model"]\nlarge = ["large-model"]\nsolo = ["large-model"]'
    fresh_gateway.policy_path.write_text(
        routing_policy(artifact, tiers=tiers) + POLICY_EXTRA
        + f'[routing.routers.pick]\nweak = "small"\nstrong = "solo"\nartifact = "{artifact}"\n')
    assert fresh_gateway.run(fresh_gateway.gateway.policies.reload_async())
    found = samples(fresh_gateway)
    assert {(s.labels["router"], s.labels["tier"]) for s in found
            if s.name == "gateway_route_decisions_total"} == {
        ("auto", "small"), ("auto", "large"), ("pick", "small"), ("pick", "solo")}


def test_traffic_brings_no_new_value_to_the_labels_known_at_start_up(
        fresh_gateway: GatewayServer) -> None:
    before = samples(fresh_gateway)
    serve_a_bit_of_everything(fresh_gateway)
    after = samples(fresh_gateway)
    for metric, label in ENUMERATED:
        assert values(after, metric, label) == values(before, metric, label), (metric, label)
    assert values(after, "gateway_shed_total", "reason") >= {"breaker_open"}


def test_the_error_types_started_at_zero_are_every_type_the_gateways_errors_have() -> None:
    types = {cls.type for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.GatewayError)}
    assert types | {"tokens"} == set(ERROR_TYPES)  # RateLimited's type is requests or tokens
