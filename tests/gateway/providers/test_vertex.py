"""Vertex AI upstreams (``type = "vertex"``) through a running gateway: the official anthropic
and openai SDKs in front, the fake Google (gateway.testing.fake_gemini) behind, signing in
with a service account whose JWTs google-auth signs for real and the fake's token endpoint
checks, so a wrong key or a token it never issued is refused as Google refuses it.

Claude (``publisher = "anthropic"``): rawPredict / streamRawPredict, the model in the URL,
``anthropic_version`` in the body. Gemini (``publisher = "google"``): generateContent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.testing.fake_gemini import VERTEX_ANTHROPIC_VERSION, FakeGoogle
from gateway.testing.google_tokens import TokenIssuer, service_account
from gateway.testing.server import ServerThread
from tests.conftest import GatewayServer

SA_ENV = "GATEWAY_TEST_VERTEX_SA"
CLAUDE = "claude-sonnet-4-5@20250929"
#: A system prompt long enough for Claude to cache (~2,000 tokens).
RULES = "\n".join(f"Rule {i}: answer the traveller about booking change number {i}, in full "
                  "sentences, checking the fare rules first." for i in range(100))


@dataclass
class Google:
    app: FakeGoogle
    url: str
    key_file: Path
    issuer: TokenIssuer


@pytest.fixture(scope="module")
def google_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Google]:
    app = FakeGoogle(simulate_cache=True)
    with ServerThread(app) as srv:
        app.issuer = TokenIssuer.of(srv.url + "/token")
        key_file = tmp_path_factory.mktemp("vertex") / "service-account.json"
        key_file.write_bytes(orjson.dumps(app.issuer.account))
        yield Google(app, srv.url, key_file, app.issuer)


@pytest.fixture
def google(google_server: Google, monkeypatch: pytest.MonkeyPatch) -> Google:
    google_server.app.clear()
    google_server.issuer.lifetime_s = 3600.0
    google_server.issuer.granted = 0
    monkeypatch.setenv(SA_ENV, str(google_server.key_file))
    return google_server


def vertex_toml(url: str, publisher: str, model: str, auth: str = "",
                name: str = "vertex", alias: str = "vmodel") -> str:
    """Upstream ``name`` (a Vertex ``publisher``'s ``model``) served as model ``alias``."""
    auth = auth or f'credentials_file_env = "{SA_ENV}"'
    return f"""
[upstreams.{name}]
type = "vertex"
base_url = "{url}"
forward_headers = ["x-fake-*"]
google = {{ project = "fake-project", location = "us-east5", publisher = "{publisher}", {auth} }}

[models.{alias}]
targets = [{{ upstream = "{name}", model = "{model}" }}]
"""


@pytest.fixture
def claude_gw(make_gateway: Callable[..., GatewayServer], google: Google) -> GatewayServer:
    return make_gateway(vertex_toml(google.url, "anthropic", CLAUDE))


def model_calls(google: Google) -> list[Any]:
    """The requests the fake's models received (the token endpoint's left out)."""
    return [r for r in google.app.records if r.path != "/token"]


def aclient(gw: GatewayServer, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, **kw)


def oclient(gw: GatewayServer, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0, **kw)


# -- Claude --------------------------------------------------------------------------------------

def test_claude_answers_an_anthropic_client_through_raw_predict(claude_gw, google):
    with aclient(claude_gw) as c:
        message = c.messages.create(model="vmodel", max_tokens=64,
                                    messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].type == "text" and message.content[0].text.startswith("tok0")
    rec = model_calls(google)[-1]
    assert rec.path == f"/v1/projects/fake-project/locations/us-east5/publishers/anthropic/" \
                       f"models/{CLAUDE}:rawPredict"
    assert rec.json["anthropic_version"] == VERTEX_ANTHROPIC_VERSION and "model" not in rec.json
    assert rec.headers["authorization"].startswith("Bearer ya29.fake-")
    assert "anthropic-version" not in rec.headers


def test_claude_streams_to_anthropic_and_openai_clients(claude_gw, google):
    with aclient(claude_gw) as c, c.messages.stream(
            model="vmodel", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
    assert text == " ".join(f"tok{i}" for i in range(8))
    assert model_calls(google)[-1].path.endswith(f"{CLAUDE}:streamRawPredict")
    with oclient(claude_gw) as c:
        chunks = list(c.chat.completions.create(
            model="vmodel", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_claude_calls_an_openai_clients_tool_and_answers_structured_output(claude_gw, google):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}]
    with oclient(claude_gw, default_headers={"x-fake-tool": "1"}) as c:
        done = c.chat.completions.create(model="vmodel", tools=tools,
                                         messages=[{"role": "user", "content": "weather?"}])
    call = done.choices[0].message.tool_calls[0]
    assert (done.choices[0].finish_reason, call.function.name) == ("tool_calls", "get_weather")
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    with oclient(claude_gw) as c:
        done = c.chat.completions.create(
            model="vmodel", messages=[{"role": "user", "content": "where?"}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "place", "schema": schema}})
    assert isinstance(orjson.loads(done.choices[0].message.content)["city"], str)
    assert model_calls(google)[-1].json["output_config"]["format"]["type"] == "json_schema"


def test_a_conversation_reads_claudes_prompt_cache_through_vertex(claude_gw, google):
    messages: list[Any] = []
    with oclient(claude_gw) as c:
        for turn in range(3):
            messages.append({"role": "user", "content": f"question {turn} " + "more " * 20})
            done = c.chat.completions.create(
                model="vmodel", messages=[{"role": "system", "content": RULES}, *messages])
            messages.append({"role": "assistant", "content": done.choices[0].message.content})
    records = claude_gw.logged(3)
    read = [r["cache_read_tokens"] or 0 for r in records]
    assert read[0] == 0 and all(n > 1000 for n in read[1:])
    assert "cache_control" in str(model_calls(google)[-1].json)  # the stage's breakpoints
    assert done.usage is not None and done.usage.prompt_tokens_details is not None
    assert done.usage.prompt_tokens_details.cached_tokens == read[-1]
    # an Anthropic client's own breakpoint goes to Vertex as it came
    system = [{"type": "text", "text": RULES + "\nAnthropic.",
               "cache_control": {"type": "ephemeral"}}]
    with aclient(claude_gw) as a:
        first, second = (a.messages.create(
            model="vmodel", max_tokens=8, system=system,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": q}]) for q in ("one", "two"))
    assert first.usage.cache_creation_input_tokens and not first.usage.cache_read_input_tokens
    assert (second.usage.cache_read_input_tokens or 0) > 2000  # the system prompt, read


def test_vertex_throttling_reaches_each_client_in_its_own_format(claude_gw, google):
    steer = {"x-fake-google-status": "429", "x-fake-retry-after": "0"}
    with aclient(claude_gw, default_headers=steer) as c, \
            pytest.raises(anthropic.RateLimitError) as caught:
        c.messages.create(model="vmodel", max_tokens=8,
                          messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert "exhausted" in caught.value.body["error"]["message"]  # type: ignore[index]
    with oclient(claude_gw, default_headers={**steer, "x-fake-google-status": "503"}) as c, \
            pytest.raises(openai.InternalServerError) as failed:
        c.chat.completions.create(model="vmodel", messages=[{"role": "user", "content": "hi"}])
    assert failed.value.status_code == 503
    assert len(model_calls(google)) == 3 + 3  # each retried up to the policy's 3 attempts


def test_anthropic_counts_tokens_through_vertex(claude_gw, google):
    with aclient(claude_gw) as c:
        counted = c.messages.count_tokens(model="vmodel",
                                          messages=[{"role": "user", "content": "a b c"}])
    assert counted.input_tokens == 3
    assert model_calls(google)[-1].path.endswith("/models/count-tokens:rawPredict")


# -- auth ----------------------------------------------------------------------------------------

def test_a_token_is_reused_while_valid_and_refreshed_before_it_expires(make_gateway, google):
    for lifetime_s, grants in ((3600, 1), (120, 2)):
        google.issuer.granted, google.issuer.lifetime_s = 0, lifetime_s
        gw = make_gateway(vertex_toml(google.url, "anthropic", CLAUDE))
        with aclient(gw) as c:
            for _ in range(2):
                c.messages.create(model="vmodel", max_tokens=8,
                                  messages=[{"role": "user", "content": "hi"}])
        # 120 s is inside google-auth's refresh margin (3 min 45 s): replaced before each use
        assert google.issuer.granted == grants


def test_a_revoked_token_is_replaced_on_the_next_request(claude_gw, google):
    with aclient(claude_gw) as c:
        c.messages.create(model="vmodel", max_tokens=8,
                          messages=[{"role": "user", "content": "hi"}])
        google.issuer.revoke()
        with pytest.raises(anthropic.AuthenticationError) as caught:
            c.messages.create(model="vmodel", max_tokens=8,
                              messages=[{"role": "user", "content": "hi"}])
        assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        c.messages.create(model="vmodel", max_tokens=8,
                          messages=[{"role": "user", "content": "hi"}])
    assert google.issuer.granted == 2


def test_application_default_credentials_sign_in(make_gateway, google, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(google.key_file))
    monkeypatch.delenv(SA_ENV)
    gw = make_gateway(vertex_toml(google.url, "anthropic", CLAUDE, auth='credentials_file = ""'))
    with aclient(gw) as c:
        c.messages.create(model="vmodel", max_tokens=8,
                          messages=[{"role": "user", "content": "hi"}])
    assert google.issuer.granted == 1


def test_the_fake_refuses_a_token_it_never_issued_and_a_key_it_does_not_know(
        make_gateway, google, tmp_path, monkeypatch):
    path = "/v1/projects/fake-project/locations/us-east5/publishers/anthropic/models/c:rawPredict"
    r = httpx.post(google.url + path, json={"anthropic_version": VERTEX_ANTHROPIC_VERSION},
                   headers={"authorization": "Bearer ya29.made-up"})
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    info, _ = service_account(google.url + "/token")  # same account, another key
    (tmp_path / "other.json").write_bytes(orjson.dumps(info))
    monkeypatch.setenv(SA_ENV, str(tmp_path / "other.json"))
    gw = make_gateway(vertex_toml(google.url, "anthropic", CLAUDE))
    with aclient(gw) as c, pytest.raises(anthropic.APIStatusError) as caught:
        c.messages.create(model="vmodel", max_tokens=8,
                          messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502 and google.issuer.granted == 0
    assert len(model_calls(google)) == 1  # the made-up token's: none from the gateway


def test_without_credentials_the_upstream_is_disabled(make_gateway, google, monkeypatch):
    monkeypatch.delenv(SA_ENV)  # named in the config, unset: as an unset api_key_env
    assert make_gateway(vertex_toml(google.url, "anthropic", CLAUDE)).gateway.upstreams[
        "vertex"].enabled is False
    monkeypatch.setenv(SA_ENV, "/nonexistent/key.json")
    gw = make_gateway(vertex_toml(google.url, "anthropic", CLAUDE))
    assert gw.gateway.upstreams["vertex"].enabled is False
    with aclient(gw) as c, pytest.raises(anthropic.APIStatusError) as caught:
        c.messages.create(model="vmodel", max_tokens=8,
                          messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code in (503, 529)


# -- Gemini on Vertex ----------------------------------------------------------------------------

def test_gemini_on_vertex_answers_openai_and_anthropic_clients(make_gateway, google):
    gw = make_gateway(vertex_toml(google.url, "google", "gemini-2.5-pro"))
    words = " ".join(f"tok{i}" for i in range(8))
    with oclient(gw) as c:
        done = c.chat.completions.create(model="vmodel",
                                         messages=[{"role": "user", "content": "hi"}])
    assert done.choices[0].message.content == words
    rec = model_calls(google)[-1]
    assert rec.path == "/v1/projects/fake-project/locations/us-east5/publishers/google/" \
                       "models/gemini-2.5-pro:generateContent"
    assert rec.headers["authorization"].startswith("Bearer ya29.fake-")
    assert "x-goog-api-key" not in rec.headers and "model" not in rec.json
    with aclient(gw) as a, a.messages.stream(model="vmodel", max_tokens=64,
                                             messages=[{"role": "user", "content": "hi"}]) as s:
        assert "".join(s.text_stream) == words
    assert model_calls(google)[-1].path.endswith("gemini-2.5-pro:streamGenerateContent?alt=sse")
    assert google.issuer.granted == 1


@pytest.mark.parametrize(("publisher", "model"), [("anthropic", CLAUDE),
                                                  ("google", "gemini-2.5-pro")])
def test_a_responses_client_and_anthropic_structured_output_reach_either_publisher(
        make_gateway, google, publisher, model):
    gw = make_gateway(vertex_toml(google.url, publisher, model))
    words = " ".join(f"tok{i}" for i in range(8))
    with oclient(gw) as c:
        assert c.responses.create(model="vmodel", input="hi").output_text == words
        events = list(c.responses.create(model="vmodel", input="hi", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == words
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    with aclient(gw) as a:
        message = a.messages.create(
            model="vmodel", max_tokens=64, messages=[{"role": "user", "content": "where?"}],
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert set(orjson.loads(message.content[0].text)) == {"city"}  # type: ignore[union-attr]
