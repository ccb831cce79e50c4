"""The request pipeline as the policy names it, through a running gateway: which stages run,
in which order, what a bad list does (at start-up, in `gateway check`, on live reload), and
that a request finishes on the policy snapshot it started with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.cli import main
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.policy import PipelinePolicy, PolicyStore
from gateway.stage_table import STAGES, check_stages
from tests.conftest import (
    DEFAULT_POLICY,
    FakeServer,
    GatewayServer,
    gateway_toml,
    wait_generation,
)
from tests.gateway.routing.test_routing import (
    HARD,
    MODELS,
    constant_embed,
    routing_policy,
    tiny_artifact,
)

CACHE_CONFIG = '\n[cache]\nenabled = true\nbackend = "memory"\nsemantic = false\n'
CACHE_ON = "\n[cache]\nenabled = true\nsemantic = false\n"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
#: A model on an upstream with the default read timeout (2 min): the fake may hold it long.
HELD = '\n[models."held"]\ntargets = [{ upstream = "backup", model = "held-upstream" }]\n'
NO_CACHE = ["route", "admission"]


def policy(version: str = "v1", stages: list[str] | None = None, base: str = DEFAULT_POLICY,
           extra: str = "") -> str:
    """``base`` with the given version, the cache stage's policy on, and a pipeline."""
    text = base.replace('version = "test-1"', f'version = "{version}"') + CACHE_ON + extra
    if stages is not None:
        text += f"\n[pipeline]\nstages = {json.dumps(stages)}\n"
    return text


def ask(gw: GatewayServer, model: str = "fake-model",
        messages: list[dict[str, str]] = MESSAGES) -> httpx.Response:
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
        raw = c.chat.completions.with_raw_response.create(model=model, messages=messages)
        raw.parse()
        return raw.http_response


def stored(gw: GatewayServer) -> None:
    """Wait until the cache's background stores of the requests so far are done."""
    assert gw.gateway.cache is not None
    gw.run(gw.gateway.cache.drain())


def edit(gw: GatewayServer, text: str) -> None:
    store: PolicyStore = gw.gateway.policies
    generation = store.generation
    gw.policy_path.write_text(text)
    assert wait_generation(store, generation), "the edit was never picked up"


def log_of(gw: GatewayServer, response: httpx.Response, n: int) -> dict[str, Any]:
    """The log line of ``response``, once ``n`` lines were written."""
    request_id = response.headers["x-request-id"]
    [record] = [r for r in gw.logged(n) if r["request_id"] == request_id]
    return record


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    return tiny_artifact(tmp_path / "tiny.npz")


# --- which stages run, in which order --------------------------------------------------------

@pytest.mark.parametrize(("stages", "x_cache", "upstream_calls"), [
    (None, ["miss", "hit"], 1),  # the default pipeline: cache, route, prompt_cache, admission
    (NO_CACHE, [None, None], 2),
])
def test_the_cache_answers_only_when_the_pipeline_names_it(
        make_gateway, fake, stages, x_cache, upstream_calls):
    gw = make_gateway(CACHE_CONFIG, policy=policy(stages=stages))
    first = ask(gw)
    stored(gw)
    second = ask(gw)
    assert [first.headers.get("x-cache"), second.headers.get("x-cache")] == x_cache
    assert len(fake.records) == upstream_calls
    records = [log_of(gw, first, 2), log_of(gw, second, 2)]
    assert [r["cache"] for r in records] == x_cache
    assert [r["policy_version"] for r in records] == ["v1", "v1"]


@pytest.mark.parametrize(("stages", "hit_tier", "hit_router"), [
    (["cache", "route", "admission"], None, None),  # a hit answers before routing
    (["route", "cache", "admission"], "large", "auto"),  # routed first, then the hit
])
def test_the_stages_run_in_the_order_the_policy_lists(
        make_gateway, fake, artifact, stages, hit_tier, hit_router):
    text = policy(stages=stages, base=routing_policy(artifact))
    gw = make_gateway(MODELS + CACHE_CONFIG, policy=text, embed=constant_embed)
    miss = ask(gw, "auto", [{"role": "user", "content": HARD}])
    assert (miss.headers["x-cache"], miss.headers["x-route-tier"]) == ("miss", "large")
    stored(gw)
    hit = ask(gw, "auto", [{"role": "user", "content": HARD}])
    assert hit.headers["x-cache"] == "hit"
    assert hit.headers.get("x-route-tier") == hit_tier
    assert len(fake.records) == 1
    assert log_of(gw, miss, 2)["router"] == "auto"
    record = log_of(gw, hit, 2)
    assert (record["cache"], record["router"], record["route_tier"]) == (
        "hit", hit_router, hit_tier)


ONE_SLOT = """
[admission]
max_concurrency = 1
max_queue = 0
"""


@pytest.mark.parametrize(("stages", "second_status"), [
    (None, 503),  # the default pipeline admits one request at a time: the second is shed
    (["cache", "route"], 200),  # no admission stage: no slot to wait for
])
def test_admission_limits_apply_only_when_the_pipeline_names_it(
        make_gateway, fake, stages, second_status):
    gw = make_gateway(HELD, policy=policy(stages=stages, extra=ONE_SLOT))
    body = {"model": "held", "messages": MESSAGES}
    # The first request streams and the fake holds it after its first word: it keeps its
    # slot (admission holds slots until the last byte).
    with httpx.Client(base_url=gw.v1, timeout=10) as c, c.stream(
            "POST", "/chat/completions", json={**body, "stream": True},
            headers={"x-fake-itl-ms": "60000", "x-fake-tokens": "2"}) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # kept: dropping the iterator would close the connection
        assert any('"w0 "' in line for line in lines)
        second = c.post("/chat/completions", json=body)
        assert fake.records[0].finished is None  # the first one is still in flight
    assert second.status_code == second_status
    if second_status == 503:
        assert second.headers["x-gateway-degraded"] == "queue_full"
        assert second.json()["error"]["type"] == "overloaded_error"
        assert len(fake.records) == 1
    else:
        assert second.json()["choices"][0]["message"]["content"] == "w0 w1 w2 w3 w4 w5 w6 w7"
        assert len(fake.records) == 2


# --- the stage table ------------------------------------------------------------------------

def test_the_stage_table_reads_as_the_default_pipeline() -> None:
    assert tuple(STAGES) == PipelinePolicy().stages
    check_stages(PipelinePolicy().stages)
    assert all(set(row.after) < set(STAGES) for row in STAGES.values())


# --- bad pipeline lists ----------------------------------------------------------------------

BAD = pytest.mark.parametrize(("stages", "message"), [
    ('["cache", "x"]', ("pipeline.stages[1]: unknown stage 'x'; known stages: admission, "
                        "cache, coalesce, compress, prompt_cache, rate_limit, route")),
    ('["cache", "route", "cache"]', "pipeline.stages[2]: 'cache' is listed twice"),
    ('["admission", "route"]', "pipeline.stages[0]: 'admission' must come after 'route'"),
    ('["route", "compress", "cache"]',
     "pipeline.stages[1]: 'compress' must come after 'cache'"),
    ('"cache"', "pipeline.stages: expected a list"),
], ids=["unknown", "duplicate", "impossible-order", "impossible-order-2", "not-a-list"])


def write_config(tmp_path: Path, fake_server: FakeServer, stages: str) -> Path:
    (tmp_path / "policy.toml").write_text(f"{DEFAULT_POLICY}\n[pipeline]\nstages = {stages}\n")
    path = tmp_path / "gateway.toml"
    path.write_text(gateway_toml(fake_server.url))
    return path


@BAD
def test_a_bad_pipeline_stops_the_gateway_at_start_up(tmp_path, fake_server, stages, message):
    config = load_config(write_config(tmp_path, fake_server, stages))
    with pytest.raises(ConfigError) as caught:
        create_app(config)
    assert f"{tmp_path / 'policy.toml'}: {message}" in str(caught.value)


@BAD
def test_gateway_check_reports_a_bad_pipeline(tmp_path, fake_server, capsys, stages, message):
    path = write_config(tmp_path, fake_server, stages)
    assert main(["check", str(path)]) == 2
    assert f"{tmp_path / 'policy.toml'}: {message}" in capsys.readouterr().err


@BAD
def test_a_bad_pipeline_edit_is_rejected_live_and_the_old_one_keeps_serving(
        make_gateway, fake, stages, message):
    gw = make_gateway(CACHE_CONFIG, policy=policy(), watch=True)
    assert ask(gw).headers["x-cache"] == "miss"
    stored(gw)
    with capture_logs() as logs:
        edit(gw, policy("v2") + f"\n[pipeline]\nstages = {stages}\n")
    assert gw.gateway.policies.rejected == 1
    [rejected] = [e for e in logs if e["event"] == "policy_rejected"]
    assert rejected["error"].startswith(f"{gw.policy_path}: {message}")
    assert gw.gateway.policy.version == "v1"
    after = ask(gw)
    assert after.headers["x-cache"] == "hit"  # still the old pipeline, cache first
    assert log_of(gw, after, 2)["policy_version"] == "v1"


# --- a reload in the middle of a request -----------------------------------------------------

def test_a_request_finishes_on_the_snapshot_it_started_with(make_gateway, fake):
    gw = make_gateway(CACHE_CONFIG + HELD, policy=policy("v1"), watch=True)
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c, \
            c.chat.completions.with_streaming_response.create(
                model="held", messages=MESSAGES, stream=True,
                extra_headers={"x-fake-itl-ms": "1000", "x-fake-tokens": "3"}) as streaming:
        chunks = iter(streaming.parse())
        received = [next(chunks), next(chunks)]  # the role chunk, then "w0 "
        assert received[1].choices[0].delta.content == "w0 "
        edit(gw, policy("v2", NO_CACHE))  # while the fake holds the rest of the stream
        assert gw.gateway.policy.version == "v2"
        assert fake.records[0].finished is None, "the stream ended before the reload"
        received += list(chunks)
        old = streaming.http_response
    text = "".join(c.choices[0].delta.content or "" for c in received if c.choices)
    assert text == "w0 w1 w2"
    assert [c.choices[0].finish_reason for c in received if c.choices][-1] == "stop"
    assert old.headers["x-cache"] == "miss"
    record = log_of(gw, old, 1)
    assert (record["policy_version"], record["status"], record["error_type"]) == ("v1", 200, None)

    stored(gw)  # v1's cache stage stores the answer after its last byte
    new = ask(gw, "held")
    assert "x-cache" not in new.headers  # v2 has no cache stage, though the answer is there
    assert log_of(gw, new, 2)["policy_version"] == "v2"
    assert len(fake.records) == 2

    edit(gw, policy("v3"))
    hit = ask(gw, "held")
    assert hit.headers["x-cache"] == "hit"
    assert hit.json()["choices"][0]["message"]["content"] == "w0 w1 w2"
    assert len(fake.records) == 2
    assert log_of(gw, hit, 3)["policy_version"] == "v3"
