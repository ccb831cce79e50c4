"""Rate limits per key through running gateways: the headers and the 429 as the official
openai and anthropic SDKs see them, tokens reserved and settled, per-key and per-model
limits, and two gateways sharing one real Redis (redis-stack-server) holding a key's limit
jointly, then going on under their own limits when that Redis is killed."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from structlog.testing import capture_logs

from gateway.cli import main
from gateway.stages.rate_limit import duration, reservation
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.redis_server import RedisServer
from gateway.testing.server import free_port
from tests.conftest import DEFAULT_POLICY, FakeServer, GatewayServer, gateway_toml

HELLO = [{"role": "user", "content": "Say hi"}]
_prefixes = itertools.count()


def limits(section: str) -> str:
    return DEFAULT_POLICY + "\n[rate_limits]\n" + section + "\n"


def redis_config(url: str) -> str:
    """The gateway config's [rate_limits], with a prefix of its own per test."""
    return f'\n[rate_limits]\nredis_url = "{url}"\nprefix = "t{next(_prefixes)}:"\n'


def sdk(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0)


def chat(gw: GatewayServer, **kwargs: Any) -> Any:
    with sdk(gw) as client:
        return client.chat.completions.with_raw_response.create(
            model=kwargs.pop("model", "fake-model"), messages=HELLO, **kwargs)


def post(client: httpx.Client, gw: GatewayServer, **body: Any) -> httpx.Response:
    return client.post(gw.v1 + "/chat/completions",
                       json={"model": "fake-model", "messages": HELLO, **body})


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


# --- what clients see ------------------------------------------------------------------------

def test_openai_clients_get_the_headers_then_a_429_with_retry_after(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(policy=limits("default = { requests_per_minute = 3, "
                                    "tokens_per_minute = 100000 }"))
    seen = [chat(gw, max_tokens=10).headers for _ in range(3)]
    assert [h["x-ratelimit-limit-requests"] for h in seen] == ["3"] * 3
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["2", "1", "0"]
    assert seen[0]["x-ratelimit-reset-requests"] == "20s"  # one request of a 3/min bucket
    assert re.fullmatch(r"(59|60)(\.\d+)?s", seen[2]["x-ratelimit-reset-requests"])
    assert seen[0]["x-ratelimit-limit-tokens"] == "100000"
    assert 100000 - 100 < int(seen[0]["x-ratelimit-remaining-tokens"]) < 100000
    assert re.fullmatch(r"\d+ms", seen[0]["x-ratelimit-reset-tokens"])

    with pytest.raises(openai.RateLimitError) as caught, sdk(gw) as client:
        client.chat.completions.create(model="fake-model", messages=HELLO)
    err = caught.value
    assert (err.status_code, err.type, err.code) == (429, "requests", "rate_limit_exceeded")
    assert ("Rate limit reached for requests without a key on requests per min (RPM): "
            "Limit 3, Remaining 0, Requested 1. Please try again in ") in err.message
    headers = err.response.headers
    assert headers["retry-after"] in ("19", "20")
    assert 15_000 < int(headers["retry-after-ms"]) <= 20_000
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert len(fake.records) == 3  # the refused request never left the gateway

    refused = gw.logged(4)[-1]
    assert (refused["status"], refused["rate_limit"], refused["rate_limited"]) == (
        429, "local", "requests")
    assert (refused["error_type"], refused["error_code"]) == ("requests", "rate_limit_exceeded")
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'gateway_rate_limit_total{result="allowed",store="local"} 3.0' in metrics
    assert 'gateway_rate_limit_total{result="requests",store="local"} 1.0' in metrics


def test_pass_through_paths_count_against_the_keys_requests_per_minute(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    """/v1/moderations and the like are not a way around a key's RPM: each counts, jointly
    with its chat requests; over the limit, the same 429 and headers, and nothing
    forwarded."""
    gw = make_gateway(policy=limits("default = { requests_per_minute = 3 }"))
    first = httpx.post(gw.v1 + "/moderations", content=b"x")
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining-requests"] == "2"
    assert chat(gw).headers["x-ratelimit-remaining-requests"] == "1"
    assert httpx.post(gw.v1 + "/audio/speech").headers["x-ratelimit-remaining-requests"] == "0"
    forwarded = len(fake.records)
    with sdk(gw) as client, pytest.raises(openai.RateLimitError) as caught:
        client.moderations.create(input="hello")
    refused = caught.value.response
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(refused.headers["retry-after"]) >= 1
    assert caught.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    assert len(fake.records) == forwarded  # the refused one never reached the upstream
    log = gw.logged(4)[-1]
    assert (log["route"], log["path"], log["status"], log["rate_limited"]) == (
        "passthrough", "/v1/moderations", 429, "requests")


def test_streams_carry_the_headers_too(make_gateway: Callable[..., GatewayServer],
                                       fake: FakeUpstream) -> None:
    gw = make_gateway(policy=limits("default = { requests_per_minute = 5 }"))
    with sdk(gw) as client, client.chat.completions.with_streaming_response.create(
            model="fake-model", messages=HELLO, stream=True) as response:
        assert response.headers["x-ratelimit-remaining-requests"] == "4"
        assert "x-ratelimit-limit-tokens" not in response.headers  # no token limit set
        assert sum(1 for _ in response.iter_lines()) > 0


def test_anthropic_clients_get_a_rate_limit_error(make_gateway: Callable[..., GatewayServer],
                                                  fake: FakeUpstream) -> None:
    gw = make_gateway(policy=limits("default = { requests_per_minute = 1 }"))
    with anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0) as client:
        first = client.messages.with_raw_response.create(model="fake-model", max_tokens=16,
                                                         messages=HELLO)
        assert first.headers["x-ratelimit-remaining-requests"] == "0"
        # And Anthropic's own family, the reset an RFC 3339 time as Anthropic sends it.
        assert first.headers["anthropic-ratelimit-requests-limit"] == "1"
        assert first.headers["anthropic-ratelimit-requests-remaining"] == "0"
        reset = datetime.fromisoformat(first.headers["anthropic-ratelimit-requests-reset"])
        assert 58 <= (reset - datetime.now(UTC)).total_seconds() <= 61
        with pytest.raises(anthropic.RateLimitError) as caught:
            client.messages.create(model="fake-model", max_tokens=16, messages=HELLO)
    err = caught.value
    assert err.status_code == 429
    assert isinstance(err.body, dict) and err.body["error"]["type"] == "rate_limit_error"
    assert "requests per min (RPM): Limit 1" in err.body["error"]["message"]
    assert int(err.response.headers["retry-after"]) in (59, 60)
    assert err.response.headers["x-ratelimit-limit-requests"] == "1"
    assert err.response.headers["anthropic-ratelimit-requests-remaining"] == "0"


def test_no_limit_no_stage(gw: GatewayServer, fake: FakeUpstream) -> None:
    headers = chat(gw).headers
    assert not [h for h in headers if h.startswith("x-ratelimit-")]
    assert gw.logged(1)[0]["rate_limit"] is None


# --- tokens: reserved on arrival, settled to the usage ---------------------------------------

def test_unused_max_tokens_come_back_once_the_answer_is_in(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(policy=limits("default = { tokens_per_minute = 1000 }"))
    first = chat(gw, max_tokens=600)
    reserved = 1000 - int(first.headers["x-ratelimit-remaining-tokens"])
    assert reserved > 600  # so a second one fits only once the first gave back its unused
    used = first.parse().usage.total_tokens
    gw.run(gw.gateway.rate_limiter.drain())
    second = chat(gw, max_tokens=600)
    assert second.http_response.status_code == 200
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == pytest.approx(
        1000 - used - reserved, abs=10)  # 1000/min refill: ~17 tokens a second


def test_a_request_over_the_whole_limit_waits_for_a_full_bucket(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(policy=limits("default = { tokens_per_minute = 1000 }"))
    big = chat(gw, max_tokens=5000)
    assert big.headers["x-ratelimit-remaining-tokens"] == "0"
    gw.run(gw.gateway.rate_limiter.drain())
    assert chat(gw, max_tokens=10).http_response.status_code == 200


def test_an_error_answer_gives_its_tokens_back(make_gateway: Callable[..., GatewayServer],
                                               fake: FakeUpstream) -> None:
    gw = make_gateway(policy=limits("default = { tokens_per_minute = 1000 }"))
    with pytest.raises(openai.BadRequestError) as caught:
        chat(gw, max_tokens=900, extra_headers={"x-fake-status": "400"})
    assert int(caught.value.response.headers["x-ratelimit-remaining-tokens"]) < 100
    gw.run(gw.gateway.rate_limiter.drain())
    assert chat(gw, max_tokens=900).http_response.status_code == 200


# --- per key, per key and model ---------------------------------------------------------------

def test_keys_and_models_have_their_own_limits(make_gateway: Callable[..., GatewayServer],
                                               fake: FakeUpstream,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TEST_RL_A", "secret-a")
    monkeypatch.setenv("GATEWAY_TEST_RL_B", "secret-b")
    keys = ('\n[[auth.keys]]\nid = "a"\nkey_env = "GATEWAY_TEST_RL_A"\n'
            '\n[[auth.keys]]\nid = "b"\nkey_env = "GATEWAY_TEST_RL_B"\n')
    gw = make_gateway(keys, policy=limits(
        'default = { requests_per_minute = 100 }\n'
        '[rate_limits.keys.a]\nrequests_per_minute = 50\n'
        'models = { "fake-model" = { requests_per_minute = 1 } }\n'))

    def call(key: str, model: str) -> httpx.Response:
        return httpx.post(gw.v1 + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                          json={"model": model, "messages": HELLO})

    first = call("secret-a", "fake-model")
    assert first.status_code == 200
    # Of the key's bucket (49 left) and the model's (0 left), the one with less left.
    assert (first.headers["x-ratelimit-limit-requests"],
            first.headers["x-ratelimit-remaining-requests"]) == ("1", "0")
    refused = call("secret-a", "fm")  # an alias of fake-model: the same limit
    assert refused.status_code == 429
    assert "key 'a' and model 'fake-model'" in refused.json()["error"]["message"]
    other = call("secret-a", "with-fallback")
    assert other.status_code == 200
    assert other.headers["x-ratelimit-remaining-requests"] == "48"  # refused ones don't count
    assert [call("secret-b", "fake-model").status_code for _ in range(3)] == [200] * 3


# --- replicas sharing Redis, and Redis going away ---------------------------------------------

def test_two_gateways_sharing_redis_hold_one_key_limit_jointly(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        redis_server: RedisServer) -> None:
    # A generous Redis bound: two gateways, eight clients and Redis on two shared cores; a
    # timed-out call would be decided in process (tested below), not jointly.
    policy = limits("default = { requests_per_minute = 100 }\nredis_timeout_ms = 1000.0")
    config = redis_config(redis_server.url)
    gateways = [make_gateway(config, policy=policy), make_gateway(config, policy=policy)]
    started = time.monotonic()
    with httpx.Client() as client, ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: post(client, gateways[i % 2]).status_code,
                                 range(240)))
    expected = 100 + (time.monotonic() - started) * 100 / 60  # the burst, plus the refill
    allowed = statuses.count(200)
    assert allowed == pytest.approx(expected, rel=0.1)
    assert statuses.count(429) == 240 - allowed
    for i, gw in enumerate(gateways):  # both took part, and Redis decided every request
        mine = statuses[i::2]
        assert 200 in mine and 429 in mine
        assert {r["rate_limit"] for r in gw.logged(120)} == {"redis"}


def test_two_gateways_sharing_redis_hold_one_key_token_limit_jointly(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        redis_server: RedisServer) -> None:
    policy = limits("default = { tokens_per_minute = 3000 }\nredis_timeout_ms = 1000.0")
    config = redis_config(redis_server.url)
    gateways = [make_gateway(config, policy=policy), make_gateway(config, policy=policy)]
    started = time.monotonic()
    spent = 0
    with httpx.Client(headers={"x-fake-tokens": "50"}) as client:
        for i in range(100):
            r = post(client, gateways[i % 2], max_tokens=60)
            assert r.status_code in (200, 429)
            if r.status_code == 200:
                spent += r.json()["usage"]["total_tokens"]
    expected = 3000 + (time.monotonic() - started) * 3000 / 60
    assert spent == pytest.approx(expected, rel=0.1)


def test_redis_killed_mid_run_requests_flow_under_local_limits(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    port = free_port()
    redis = RedisServer(port=port).start()
    policy = limits("default = { requests_per_minute = 40 }\nredis_timeout_ms = 1000.0\n"
                    "redis_retry_ms = 50.0")
    config = redis_config(redis.url)
    a, b = make_gateway(config, policy=policy), make_gateway(config, policy=policy)
    started = time.monotonic()
    with capture_logs() as logs, httpx.Client() as client:
        before = [post(client, (a, b)[i % 2]) for i in range(20)]
        assert [r.status_code for r in before] == [200] * 20
        assert redis.process is not None
        redis.process.kill()  # SIGKILL: no goodbye to the gateways' connections
        redis.process.wait()
        during = [post(client, (a, b)[i % 2]) for i in range(80)]
        refill = (time.monotonic() - started) * 40 / 60
        redis.stop()
        with RedisServer(port=port):
            time.sleep(0.06)  # past redis_retry_ms: the next request asks Redis again
            after = [post(client, (a, b)[i % 2]) for i in range(4)]
    assert {r.status_code for r in during} <= {200, 429}  # limited, never failed
    allowed = sum(r.status_code == 200 for r in during)
    # Each gateway had spent 10 of its 40 (its local buckets shadow what Redis admitted).
    assert 60 <= allowed <= 60 + 2 * refill + 2
    assert all(r.headers["retry-after"] for r in during if r.status_code == 429)
    assert [r.status_code for r in after] == [200] * 4
    records = a.logged(52) + b.logged(52)
    stores = [r["rate_limit"] for r in sorted(records, key=lambda r: r["ts"])]
    assert stores[:20] == ["redis"] * 20 and set(stores[20:100]) == {"fallback"}
    assert stores[100:] == ["redis"] * 4
    events = [e["event"] for e in logs]
    assert events.count("rate_limit_redis_down") == 2  # once per gateway, per outage
    assert events.count("rate_limit_redis_restored") == 2
    metrics = httpx.get(a.url + "/metrics").text
    assert re.search(r'gateway_rate_limit_total\{result="allowed",store="fallback"\} \d', metrics)


def test_a_hung_redis_costs_one_timeout_then_local_decisions(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        silent_port: int) -> None:
    gw = make_gateway(redis_config(f"redis://127.0.0.1:{silent_port}/0"),
                      policy=limits("default = { requests_per_minute = 100 }"))
    with httpx.Client() as client:
        assert [post(client, gw).status_code for _ in range(5)] == [200] * 5
    records = gw.logged(5)
    assert {r["rate_limit"] for r in records} == {"fallback"}
    assert max(r["total_ms"] for r in records) < 500


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung Redis)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


# --- configuration ----------------------------------------------------------------------------

def test_gateway_check_validates_the_section(tmp_path: Path, fake_server: FakeServer,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(gateway_toml(fake_server.url))
    policy = tmp_path / "policy.toml"
    policy.write_text(limits("default = { requests_per_minute = 10, models = "
                             '{ "fake-model" = { tokens_per_minute = 10 } } }'))
    assert main(["check", str(config)]) == 0
    policy.write_text(limits("default = { requests_per_minut = 10 }"))
    assert main(["check", str(config)]) == 2
    assert ("rate_limits.default.requests_per_minut: unknown key; allowed keys: models, "
            "requests_per_minute, tokens_per_minute") in capsys.readouterr().err
    policy.write_text(limits('[rate_limits.keys.a]\nmodels = { "gpt-9" = { requests_per_minute = 1 } }'))
    assert main(["check", str(config)]) == 2
    assert ("rate_limits.keys.a.models: the model 'gpt-9' is not configured on this gateway"
            in capsys.readouterr().err)
    policy.write_text(limits("[rate_limits.keys.a]\ntokens_per_minute = -1"))
    assert main(["check", str(config)]) == 2
    assert "rate_limits.keys.a.tokens_per_minute: must be >= 0" in capsys.readouterr().err
    policy.write_text(DEFAULT_POLICY)
    config.write_text(gateway_toml(fake_server.url, '[rate_limits]\nredis_url = "http://x"\n'))
    assert main(["check", str(config)]) == 2
    assert "rate_limits: redis_url must start with redis://" in capsys.readouterr().err


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.0001, "1ms"), (0.02, "20ms"), (1, "1s"), (1.5, "1.5s"), (59.9986, "59.999s"), (59.9994, "1m0s"),
    (360, "6m0s"), (61.25, "1m1.25s"), (3600, "1h0m0s"), (3725, "1h2m5s"),
])
def test_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_reservation_is_the_body_over_four_plus_the_completion_budget() -> None:
    raw = b"x" * 400
    assert reservation({"max_tokens": 50}, raw, 0) == 150
    assert reservation({"max_completion_tokens": 20, "max_tokens": 50}, raw, 0) == 120
    assert reservation({"max_tokens": 50, "n": 3}, raw, 0) == 250
    assert reservation({}, raw, 16) == 116
