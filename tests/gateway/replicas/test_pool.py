"""A replica pool over fake upstreams: failover, ejection and return, discovery, config."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import UpstreamConfig, load_config
from gateway.errors import ConfigError
from gateway.replicas.config import OutlierConfig, PoolConfig
from gateway.replicas.health import Outlier
from gateway.replicas.load import from_health, from_metrics
from gateway.replicas.pool import ReplicaPool
from gateway.testing.fake_upstream import FakeUpstream
from gateway.upstreams.base import UpstreamRequest
from tests.conftest import FakeServer, GatewayServer

DEAD = "http://127.0.0.1:9/v1"  # nothing listens: connection refused


def _request(text: str) -> UpstreamRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return UpstreamRequest("POST", "/chat/completions", orjson.dumps(body), [])


def _config(routing: str = "round_robin", **upstream: object) -> UpstreamConfig:
    pool = PoolConfig(routing=routing,  # type: ignore[arg-type]
                      outlier=OutlierConfig(consecutive_errors=1, base_ejection_s=30))
    return dataclasses.replace(UpstreamConfig(type="openai", replicas=("x",)), pool=pool,
                               connect_timeout_ms=500, **upstream)  # type: ignore[arg-type]


async def test_a_dead_replica_loses_no_request_and_is_ejected(
        fake_server: FakeServer) -> None:
    fake: FakeUpstream = fake_server.app
    fake.clear()
    now = [100.0]
    pool = ReplicaPool("engines", _config(replicas=(DEAD, fake_server.url + "/v1")),
                       clock=lambda: now[0])
    try:
        answers = [await pool.send(_request(f"q{i}")) for i in range(4)]
        assert [a.status for a in answers] == [200] * 4
        assert len(fake.records) == 4  # every one answered by the live replica
        dead = pool.members[DEAD]
        assert not dead.outlier.available(now[0])  # ejected after its refusal
        now[0] += 31  # its ejection is over: tried again, gradually
        assert dead.outlier.available(now[0]) and dead.outlier.weight(now[0]) < 0.2
    finally:
        await pool.aclose()


async def test_streams_fail_over_too_and_the_pool_counts_its_requests(
        fake_server: FakeServer) -> None:
    pool = ReplicaPool("engines", _config("least_load",
                                          replicas=(DEAD, fake_server.url + "/v1")))
    try:
        response = await pool.stream(dataclasses.replace(_request("s"), stream=True))
        assert response.status == 200
        live = pool.members[fake_server.url + "/v1"].state
        assert live.in_flight == 1
        await response.read()
        response.close()
        assert live.in_flight == 0 and pool.members[DEAD].state.in_flight == 0
    finally:
        await pool.aclose()


async def test_discovery_makes_a_replica_of_each_address_the_name_resolves_to(
        fake_server: FakeServer) -> None:
    port = fake_server.url.rsplit(":", 1)[1]
    pool = ReplicaPool("engines", dataclasses.replace(
        _config(), replicas=(), discover=f"http://localhost:{port}/v1"))
    await pool.start()
    try:
        assert f"http://127.0.0.1:{port}/v1" in pool.members
        assert (await pool.send(_request("found"))).status == 200
    finally:
        await pool.aclose()


def test_ejection_time_grows_with_each_ejection_and_at_most_the_allowed_share() -> None:
    outlier = Outlier(OutlierConfig(consecutive_errors=2, base_ejection_s=10,
                                    max_ejection_s=300, ramp_s=0))
    assert not outlier.failed(0.0, True)  # one error: not yet
    assert outlier.failed(0.0, True) and outlier.ejected_until == 10
    assert outlier.available(10.0)
    outlier.failed(11.0, True)
    assert outlier.failed(11.0, True) and outlier.ejected_until == 31  # 2 x 10 s
    other = Outlier(OutlierConfig(consecutive_errors=1))
    assert not other.failed(0.0, may_eject=False)  # the pool may not lose another one


@pytest.mark.parametrize(("extra", "message"), [
    ('base_url = "http://a/v1"\nreplicas = ["http://b/v1"]', "without base_url"),
    ('replicas = ["http://b/v1"]\ndiscover = "http://c/v1"', "not both"),
    ('discover = "engines:8000"', "must be a URL"),
    ('replicas = ["http://b/v1"]\n[upstreams.e.pool]\nrouting = "random"', "routing"),
    ('replicas = ["http://b/v1"]\n[upstreams.e.pool]\nbalance = 2', "balance"),
])
def test_the_config_rejects_what_a_pool_cannot_be(tmp_path: Path, extra: str,
                                                  message: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f'[upstreams.e]\ntype = "openai"\n{extra}\n')
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_load_is_read_from_our_engine_and_from_vllm_and_sglang_metrics() -> None:
    assert from_health({"status": "ok", "load": {"running": 3, "waiting": 2}}) == 5
    assert from_health({"status": "ok"}) is None and from_health(None) is None
    vllm = ('# HELP vllm:num_requests_running Number of requests running.\n'
            'vllm:num_requests_running{model_name="m"} 4.0\n'
            'vllm:num_requests_waiting{model_name="m"} 1.0\n'
            'vllm:num_requests_swapped{model_name="m"} 9.0\n')
    assert from_metrics(vllm) == 5
    assert from_metrics("sglang:num_running_reqs 2\nsglang:num_queue_reqs 7\n") == 9
    assert from_metrics("process_cpu_seconds_total 1.0\n") is None


def test_the_gateway_exports_each_replicas_state(make_gateway: Callable[..., GatewayServer],
                                                  fake_server: FakeServer) -> None:
    gw = make_gateway(f"""
[upstreams.pool]
type = "openai"
replicas = ["{DEAD}", "{fake_server.url}/v1"]
connect_timeout_ms = 500

[upstreams.pool.pool]
outlier = {{ consecutive_errors = 1 }}

[models.pooled]
targets = [{{ upstream = "pool", model = "m" }}]
""")
    for i in range(3):
        r = httpx.post(gw.v1 + "/chat/completions", json={
            "model": "pooled", "messages": [{"role": "user", "content": f"hello {i}"}]})
        assert r.status_code == 200
    page = httpx.get(gw.url + "/metrics").text
    series = {(sample.name, sample.labels["replica"]): sample.value
              for family in text_string_to_metric_families(page)
              for sample in family.samples if family.name.startswith("gateway_replica")}
    live = fake_server.url + "/v1"
    assert series[("gateway_replica_up", DEAD)] == 0 and series[("gateway_replica_up", live)]
    assert series[("gateway_replica_ejections_total", DEAD)] == 1
    assert series[("gateway_replica_in_flight", live)] == 0  # all three answered
