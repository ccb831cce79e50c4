"""Model families by pattern over real HTTP: the ids Claude Code and Codex send by default
reach their upstream as sent (or with a provider prefix stripped), an exact entry wins,
an unknown id is a 404 in the caller's format, /v1/models lists what it can, and ids a
client invents add no metric series and no per-model state."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer
from tests.gateway.routing.test_routing import (
    HARD,
    ask,
    constant_embed,
    routing_policy,
    tiny_artifact,
)

KEY_ENV = "GATEWAY_TEST_FAMILIES_ANTHROPIC_KEY"
HELLO = [{"role": "user", "content": "Say hi"}]


def families(url: str) -> str:
    return f"""
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "{url}"
api_key_env = "{KEY_ENV}"

[models."claude-opus-4-1"]
targets = [{{ upstream = "claude", model = "claude-opus-exact-upstream" }}]

[models."claude-*"]
targets = [{{ upstream = "claude" }}]
list = ["claude-sonnet-4-5", "claude-haiku-4-5"]

[models."anthropic/*"]
targets = [{{ upstream = "claude", model = "{{1}}" }}]

[models."gpt-5*"]
targets = [{{ upstream = "fake", model = "{{model}}" }}]
"""


@pytest.fixture
def make(make_gateway: Callable[..., GatewayServer],
         claude_server: tuple[FakeAnthropic, str],
         monkeypatch: pytest.MonkeyPatch) -> Callable[..., GatewayServer]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-upstream")
    claude_server[0].clear()

    def build(policy: str = DEFAULT_POLICY, extra: str = "", **kw: object) -> GatewayServer:
        return make_gateway(families(claude_server[1]) + extra, policy=policy, **kw)
    return build


@pytest.fixture
def claude(claude_server: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    return claude_server[0]


def aclient(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="sk-client", max_retries=0)


def oclient(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="sk-client", max_retries=0)


def test_claude_code_ids_reach_the_anthropic_upstream_as_they_were_sent(make, claude):
    gw = make()
    # (plain HTTP for the dated id: this anthropic SDK warns that it is deprecated)
    sonnet = httpx.post(gw.url + "/v1/messages", headers={"anthropic-version": "2023-06-01"},
                        json={"model": "claude-sonnet-4-5-20250929", "max_tokens": 16,
                              "messages": HELLO}).json()
    with aclient(gw) as c:
        with c.messages.stream(model="claude-haiku-4-5", max_tokens=16,
                               messages=HELLO) as stream:
            haiku = stream.get_final_message()
        counted = c.messages.count_tokens(model="claude-haiku-4-5", messages=HELLO)
    assert (sonnet["model"], haiku.model) == ("claude-sonnet-4-5-20250929", "claude-haiku-4-5")
    assert counted.input_tokens > 0
    assert [(r.path, r.json["model"]) for r in claude.records] == [
        ("/v1/messages", "claude-sonnet-4-5-20250929"), ("/v1/messages", "claude-haiku-4-5"),
        ("/v1/messages/count_tokens", "claude-haiku-4-5")]
    logged = [(r["model_requested"], r["model_served"]) for r in gw.logged(3)[:2]]
    assert logged == [("claude-sonnet-4-5-20250929",) * 2, ("claude-haiku-4-5",) * 2]


def test_a_provider_prefix_is_stripped_whatever_the_clients_api(make, claude):
    gw = make()
    with aclient(gw) as c:
        c.messages.create(model="anthropic/claude-x", max_tokens=16, messages=HELLO)
    with oclient(gw) as o:  # translated to the Messages API, the stripped id with it
        chat = o.chat.completions.create(model="anthropic/claude-y", messages=HELLO)
    assert chat.choices[0].message.content
    assert [r.json["model"] for r in claude.records] == ["claude-x", "claude-y"]


def test_codex_ids_reach_an_openai_format_upstream_through_the_responses_api(
        make, fake: FakeUpstream):
    gw = make()
    with oclient(gw) as o:
        answer = o.responses.create(model="gpt-5.1-codex", input="Say hi")
    assert answer.output_text
    assert [(r.path, r.json["model"]) for r in fake.records] == [
        ("/v1/chat/completions", "gpt-5.1-codex")]


def test_an_exact_entry_wins_over_a_pattern_that_matches_it(make, claude):
    gw = make()
    with aclient(gw) as c:
        c.messages.create(model="claude-opus-4-1", max_tokens=16, messages=HELLO)
    assert claude.records[0].json["model"] == "claude-opus-exact-upstream"


@pytest.mark.parametrize("model", ["gemini-2.5-pro", "claude-*", "claude-", "x" * 5000])
def test_an_id_no_entry_serves_is_a_404_in_the_callers_format(make, claude, model):
    gw = make()
    with aclient(gw) as c, pytest.raises(anthropic.NotFoundError) as caught:
        c.messages.create(model=model, max_tokens=16, messages=HELLO)
    assert caught.value.body["type"] == "error"
    with oclient(gw) as o, pytest.raises(openai.NotFoundError) as refused:
        o.chat.completions.create(model=model, messages=HELLO)
    assert refused.value.code == "model_not_found"
    assert len(refused.value.message) < 400  # the id, cut short: never echoed whole
    assert claude.records == []


def test_v1_models_lists_the_exact_names_and_each_patterns_list_in_either_format(make):
    gw = make()
    with oclient(gw) as o:
        ids = [m.id for m in o.models.list()]
    with aclient(gw) as c:
        assert [m.id for m in c.models.list()] == ids
    assert {"claude-opus-4-1", "claude-sonnet-4-5", "claude-haiku-4-5"} <= set(ids)
    assert not [i for i in ids if "*" in i]


def test_the_cache_keeps_the_ids_of_a_family_apart(make, claude):
    gw = make(DEFAULT_POLICY + "\n[cache]\nenabled = true\nsemantic = false\n",
              '\n[cache]\nenabled = true\nbackend = "memory"\n')

    def ask(model: str) -> str:
        r = httpx.post(gw.url + "/v1/messages", json={"model": model, "max_tokens": 8,
                                                      "messages": HELLO})
        assert r.status_code == 200 and r.json()["model"] == model
        assert gw.gateway.cache is not None
        gw.run(gw.gateway.cache.drain())  # stored
        return r.headers["x-cache"]

    assert [ask(m) for m in ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-sonnet-4-5")] \
        == ["miss", "miss", "hit"]


def test_a_router_may_opt_in_a_family_and_route_to_its_ids(make, fake, tmp_path: Path):
    artifact = tiny_artifact(tmp_path / "tiny.npz")
    gw = make(routing_policy(artifact, 'models = ["gpt-5*"]',
                             'small = ["gpt-5-mini"]\nlarge = ["gpt-5.1"]'),
              embed=constant_embed)
    response, _completion = ask(gw, HARD, model="gpt-5-codex")
    assert response.headers["x-route-tier"] == "large"
    assert [r.json["model"] for r in fake.records] == ["gpt-5.1"]
    assert gw.logged(1)[0]["router"] == "auto"


def _model_labels(gw: GatewayServer) -> set[str]:
    return set(re.findall(r'model="([^"]*)"', httpx.get(gw.url + "/metrics").text))


def test_ids_a_client_invents_add_no_metric_series_and_no_per_model_state(make, claude):
    gw = make(DEFAULT_POLICY + """
[rate_limits.default]
models = { "claude-*" = { requests_per_minute = 1000 } }
[admission]
model_max_concurrency = { "claude-*" = 8 }
""")
    before = _model_labels(gw)
    assert {"claude-*", "anthropic/*", "gpt-5*", "claude-opus-exact-upstream"} <= before
    rng = random.Random(46)
    ids = [f"claude-{rng.getrandbits(64):016x}" for _ in range(200)]
    with httpx.Client(base_url=gw.url) as client:
        for model in ids:
            r = client.post("/v1/messages", json={"model": model, "max_tokens": 8,
                                                  "messages": HELLO})
            assert r.status_code == 200
        client.post("/v1/messages/count_tokens", json={"model": ids[0], "messages": HELLO})
    assert [r.json["model"] for r in claude.records[:200]] == ids  # each id served as sent
    assert _model_labels(gw) - before <= {"other"}  # the pattern's series, not one an id
    assert ('gateway_requests_total{model="claude-*",route="/v1/messages",status="200"} 200.0'
            in httpx.get(gw.url + "/metrics").text)
    assert set(gw.gateway.model_limiters.limiters) == {"claude-*"}
    assert len({r["model_requested"] for r in gw.logged(201)}) == 200  # the log keeps them


def test_a_limit_on_a_family_is_shared_by_its_ids_and_one_on_an_id_is_its_own(make, claude):
    gw = make(DEFAULT_POLICY + """
[rate_limits.default]
models = { "claude-*" = { requests_per_minute = 2 }, "claude-haiku-4-5" = { requests_per_minute = 1 } }
""")

    def call(model: str) -> httpx.Response:
        return httpx.post(gw.url + "/v1/messages", json={"model": model, "max_tokens": 8,
                                                           "messages": HELLO})

    assert [call(m).status_code for m in ("claude-a", "claude-b")] == [200, 200]
    refused = call("claude-c")
    assert refused.status_code == 429
    assert "model 'claude-*'" in refused.json()["error"]["message"]
    assert [call("claude-haiku-4-5").status_code for _ in range(2)] == [200, 429]
