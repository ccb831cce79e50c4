"""What clients do besides model calls, over real HTTP: probes of the base URL answered,
count_tokens for any model a Messages request may name (a model alias, a router alias: an
Anthropic target counts, any other model is estimated), and unknown paths, methods and
models answered in the caller's API (Anthropic's for an Anthropic client: a
``/v1/messages`` path or an ``anthropic-version`` header), the log line recording the error
type that client read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from tests.conftest import GatewayServer
from tests.gateway.routing.test_routing import MODELS, constant_embed, routing_policy, tiny_artifact

KEY_ENV = "GATEWAY_TEST_PROBES_KEY"
ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "sk-client"}
HELLO = [{"role": "user", "content": "Say hi"}]


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer], claude_server: tuple[FakeAnthropic, str],
       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> GatewayServer:
    """Claude (an Anthropic upstream, with an alias) beside the OpenAI fake's models, and a
    router "auto" whose strong tier is Claude."""
    monkeypatch.setenv(KEY_ENV, "sk-ant-upstream")
    claude_server[0].clear()
    policy = routing_policy(tiny_artifact(tmp_path / "tiny.npz"),
                            tiers='small = ["small-model"]\nlarge = ["claude"]')
    return make_gateway(MODELS + f"""
[upstreams.claude]
type = "anthropic"
base_url = "{claude_server[1]}"
api_key_env = "{KEY_ENV}"

[models.claude]
targets = [{{ upstream = "claude", model = "claude-upstream" }}]
aliases = ["sonnet"]
""", policy=policy, embed=constant_embed)


def aclient(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="sk-client", max_retries=0)


@pytest.mark.parametrize("path", ["/", "/v1"])
def test_a_probe_of_the_base_url_is_answered(gw: GatewayServer, path: str):
    got = httpx.get(gw.url + path)
    assert (got.status_code, got.json()) == (200, {"status": "ok", "service": "llm-gateway"})
    head = httpx.head(gw.url + path)
    assert (head.status_code, head.content) == (200, b"")


def test_count_tokens_works_for_any_model_a_messages_request_may_name(
        gw: GatewayServer, claude_server: tuple[FakeAnthropic, str]):
    with aclient(gw) as client:
        for model in ("claude", "sonnet", "auto"):  # the model, its alias, a router alias
            counted = client.messages.with_raw_response.count_tokens(model=model,
                                                                     messages=HELLO)
            assert "x-gateway-token-count" not in counted.headers  # Anthropic counted it
            assert counted.parse().input_tokens == 2  # the fake's count: "Say hi"
        estimated = client.messages.with_raw_response.count_tokens(model="small-model",
                                                                   messages=HELLO)
    assert estimated.headers["x-gateway-token-count"] == "estimate"
    assert estimated.parse().input_tokens > 0
    assert [r.json["model"] for r in claude_server[0].records] == ["claude-upstream"] * 3


def test_an_unknown_model_is_a_404_in_the_callers_api_and_logged_as_sent(gw: GatewayServer):
    with aclient(gw) as client:
        for call in (client.messages.create, client.messages.count_tokens):
            kwargs = {"max_tokens": 8} if call == client.messages.create else {}
            with pytest.raises(anthropic.NotFoundError) as caught:
                call(model="claude-nope", messages=HELLO, **kwargs)
            body = caught.value.body
            assert isinstance(body, dict) and body["type"] == "error"
            assert body["error"]["type"] == "not_found_error"
            assert "claude-nope" in body["error"]["message"]
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client, \
            pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-nope", messages=HELLO)  # type: ignore[arg-type]
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "model_not_found"
    logged = [(r["route"], r["api"], r["status"], r["error_type"]) for r in gw.logged(3)]
    assert logged == [("/v1/messages", "anthropic", 404, "not_found_error"),
                      ("/v1/messages/count_tokens", "anthropic", 404, "not_found_error"),
                      ("/v1/chat/completions", "openai", 404, "invalid_request_error")]


ANTHROPIC_404 = {"type": "error", "error": {"type": "not_found_error"}}


@pytest.mark.parametrize(("method", "path", "headers", "status", "anthropic_shape"), [
    ("GET", "/v1/messages/batches", {}, 404, True),  # an Anthropic path the gateway lacks
    ("POST", "/v1/files", ANTHROPIC, 404, True),  # pass-through refused, Anthropic client
    ("POST", "/v1/files", {}, 404, False),  # ... an OpenAI one
    ("GET", "/nothing/here", ANTHROPIC, 404, True),
    ("GET", "/nothing/here", {}, 404, False),
    ("GET", "/v1/messages", {}, 404, True),  # a method no route of /v1 takes there
    ("POST", "/", ANTHROPIC, 405, True),  # a method the path does not take
    ("POST", "/healthz", {}, 405, False),
])
def test_an_unknown_path_or_method_is_answered_in_the_callers_api_and_logged(
        gw: GatewayServer, method: str, path: str, headers: dict[str, str], status: int,
        anthropic_shape: bool):
    got = httpx.request(method, gw.url + path, headers=headers)
    assert got.status_code == status
    body = got.json()
    if anthropic_shape:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        assert body["error"]["type"] == kind
    else:
        kind = "invalid_request_error"
        assert body["error"]["type"] == kind
        assert body["error"]["code"] == ("not_found" if status == 404 else "method_not_allowed")
    if status == 405:
        assert "GET" in got.headers["allow"] and "POST" not in got.headers["allow"]
    [line] = gw.logged(1)
    assert (line["status"], line["error_type"], line["path"]) == (status, kind, path)
    assert line["api"] == ("anthropic" if anthropic_shape else "openai")
    assert line["request_id"] == got.headers["x-request-id"]
