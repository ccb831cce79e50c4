"""Every metric the Grafana dashboard and the alert rules query is one the gateway exports.

A gateway with the cache, a router, compression and a tight admission limit serves a few
requests of each kind (cache hits, routed, compressed, streamed, queued, failed, shed), so
that its /metrics has the series a production gateway has; then every name the dashboard
and the rules read must be on that page. ``engine_*`` names come from the local engine
(served on the gateway's /metrics when it runs one): they are checked against the engine's
own registry (local_engine/metrics.py), rendered as its /metrics renders it. The same names
before any request: test_metrics_at_zero.py.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from prometheus_client import generate_latest

from local_engine.metrics import EngineMetrics
from tests.conftest import GatewayServer
from tests.deploy.promql import (
    dashboard_exprs,
    exported_names,
    metric_names,
    rule_exprs,
    selectors,
    selects,
)
from tests.gateway.routing.test_routing import (
    EASY,
    HARD,
    MODELS,
    constant_embed,
    routing_policy,
    tiny_artifact,
)
from tests.gateway.test_compress_stage import PROMPT

#: Series Prometheus makes itself (not on any /metrics page).
SYNTHETIC = {"up"}
#: Exported families without a sample here: engine scrape errors have a series per local
#: engine (at 0 from start-up, tests/gateway/test_local_upstream.py), and this gateway starts
#: none.
DECLARED_ONLY = {"gateway_engine_scrape_errors_total"}

CONFIG = MODELS + """
[cache]
enabled = true
backend = "memory"
semantic = false

[models."dead-only"]
targets = [{ upstream = "dead", model = "x" }]
"""
POLICY_EXTRA = """
[cache]
enabled = true

[compression]
enabled = true
gate = "always"
min_tokens = 200

[admission]
max_concurrency = 1
max_queue_wait_ms = 5000

[breaker]
consecutive_failures = 2

[rate_limits]
default = { requests_per_minute = 100000 }
"""


def queried() -> dict[str, list[str]]:
    """metric name -> where the dashboard or the rules read it."""
    names: dict[str, list[str]] = {}
    for where, expr in [*dashboard_exprs(), *rule_exprs()]:
        for name in metric_names(expr):
            names.setdefault(name, []).append(where)
    return names


def gateway_queried() -> dict[str, list[str]]:
    """:func:`queried` without what the gateway does not export itself (the engines' and
    Prometheus' own series)."""
    return {name: where for name, where in queried().items()
            if not name.startswith("engine_") and name not in SYNTHETIC}


def start_gateway(make_gateway: Callable[..., GatewayServer], tmp_path: Path) -> GatewayServer:
    """A gateway with the cache, a router ("auto": tiers small and large), compression,
    admission, a breaker and rate limits, before any request."""
    policy = routing_policy(tiny_artifact(tmp_path / "tiny.npz")) + POLICY_EXTRA
    return make_gateway(CONFIG, policy=policy, embed=constant_embed)


def serve_a_bit_of_everything(gw: GatewayServer) -> None:
    """Cache hits, routed, compressed, streamed, queued, failed, shed and cancelled requests,
    then a policy reload; returns once every request's metrics are counted."""
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:

        def chat(model: str, text: str, headers: dict[str, str] | None = None) -> None:
            try:
                client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": text}],
                    extra_headers=headers)
            except openai.APIError:
                pass  # the failures are the point of some of these

        for _ in range(2):  # the second is an exact cache hit
            chat("fake-model", "What is the capital of France?")
        chat("auto", EASY)
        chat("auto", HARD)
        chat("fake-model", PROMPT)  # compressed
        for chunk in client.chat.completions.create(
                model="fake-model", stream=True,
                messages=[{"role": "user", "content": "Stream, please"}]):
            pass
        with ThreadPoolExecutor(2) as pool:  # one slot: the second request queues
            list(pool.map(lambda i: chat("fake-model", f"Slow {i}", {"x-fake-ttft-ms": "300"}),
                          range(2)))
        for _ in range(4):  # fails, opens the breaker, then is shed
            chat("dead-only", "Anyone there?")
    with pytest.raises(httpx.TimeoutException):  # the client leaves: cancelled
        httpx.post(gw.v1 + "/chat/completions", timeout=0.3,
                   headers={"x-fake-ttft-ms": "3000"},
                   json={"model": "fake-model", "messages": [{"role": "user", "content": "?"}]})
    gw.logged(13)  # every request's line (and so its metrics) is written
    assert gw.run(gw.gateway.policies.reload_async())  # what the policy watcher does


@pytest.fixture
def busy_gateway(make_gateway: Callable[..., GatewayServer], tmp_path: Path) -> GatewayServer:
    gw = start_gateway(make_gateway, tmp_path)
    serve_a_bit_of_everything(gw)
    return gw


def test_every_metric_the_dashboard_and_rules_query_is_on_the_gateways_metrics(
        busy_gateway: GatewayServer) -> None:
    page = httpx.get(busy_gateway.url + "/metrics").text
    sampled, declared = exported_names(page)
    wanted = gateway_queried()
    missing = {name: where for name, where in wanted.items()
               if name not in sampled | declared}
    assert not missing, f"queried but not exported by the gateway: {missing}"
    assert {name for name in wanted if name not in sampled} <= DECLARED_ONLY
    assert len(wanted) > 25


def test_every_engine_metric_they_query_is_in_the_engines_registry() -> None:
    # A stand-in for the engine: the gauges read its scheduler and block manager.
    engine = SimpleNamespace(
        scheduler=SimpleNamespace(running=[1], waiting=[], num_preempted=0),
        blocks=SimpleNamespace(num_used=3, num_free=97, hit_rate=0.5), acceptance_length=1.0)
    metrics = EngineMetrics(engine)  # type: ignore[arg-type]
    metrics.finished.labels("stop").inc()
    sampled, _ = exported_names(generate_latest(metrics.registry).decode())
    wanted = {name: where for name, where in queried().items() if name.startswith("engine_")}
    missing = {name: where for name, where in wanted.items() if name not in sampled}
    assert not missing, f"queried but not exported by the engine: {missing}"
    assert len(wanted) >= 10


def test_the_name_extraction_reads_promql_as_prometheus_does() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le, instance) (rate(gateway_overhead_seconds_bucket'
        '{route=~"chat|embeddings"}[$__rate_interval]))) > 1e3') == {
        "gateway_overhead_seconds_bucket"}
    assert metric_names("a_total unless on (instance, upstream) b offset 5m / scalar(c)") == {
        "a_total", "b", "c"}
    assert metric_names('sum without (le) (x{a="by (y)"}) and bool z') == {"x", "z"}


def test_the_selector_extraction_keeps_each_names_matchers() -> None:
    expr = ('sum by (layer) (rate(hits_total{instance=~"$instance", result="hit"}[5m])) '
            '/ scalar(sum(rate(hits_total[5m]))) unless errors{type!~"a|b"}')
    assert selectors(expr) == [
        ("hits_total", (("instance", "=~", "$instance"), ("result", "=", "hit"))),
        ("hits_total", ()), ("errors", (("type", "!~", "a|b"),))]
    assert selects((("instance", "=~", "$instance"), ("result", "=", "hit")),
                   {"result": "hit", "layer": ""})
    assert not selects((("result", "=", "hit"),), {"result": "miss"})
    assert selects((("type", "!~", "a|b"),), {"type": "ab"})  # anchored, as Prometheus does
    assert not selects((("type", "!~", "a|b"),), {"type": "b"})
    assert selects((("layer", "=", ""),), {"result": "miss"})  # missing reads as ""
    assert not selects((("layer", "!=", ""),), {})
