"""Azure OpenAI upstreams (``type = "azure_openai"``) through a real gateway, the official
openai and anthropic SDKs as clients, gateway.testing.fake_azure as the resource (it checks
the key or token, the URL form and the api-version as Azure does)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pydantic
import pytest

from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.testing.fake_azure import FakeAzure
from gateway.testing.server import ServerThread
from tests.conftest import GatewayServer

KEY, TOKEN = "azure-test-key", "entra-test-token"
KEY_ENV, WRONG_ENV = "GATEWAY_TEST_AZURE_KEY", "GATEWAY_TEST_AZURE_WRONG_KEY"
TOKEN_ENV = "GATEWAY_TEST_AZURE_TOKEN"
LONG = "You are a careful assistant who answers in full sentences. " * 180  # ~2k tokens
LONG_TOO = "Answer as a patient teacher would, with one example each time. " * 180
TOOL: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def azure_server() -> Iterator[tuple[FakeAzure, str]]:
    app = FakeAzure(api_key=KEY, token=TOKEN)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def azure(azure_server: tuple[FakeAzure, str], monkeypatch: pytest.MonkeyPatch
          ) -> tuple[FakeAzure, str]:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(WRONG_ENV, "not-the-key")
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    app, url = azure_server
    app.clear()
    return app, url


def upstreams(url: str, token_file: Path) -> str:
    """``azure`` (v1, api-key, Responses natively), ``azure-dep`` (deployments form),
    ``azure-token`` (an Entra ID token file), ``azure-token-env`` (a token from the
    environment), ``azure-wrong`` (a key the fake refuses)."""
    common = f'base_url = "{url}"\nforward_headers = ["x-fake-*"]\nread_timeout_ms = 5000\n'
    return f"""
[upstreams.azure]
type = "azure_openai"
{common}api_key_env = "{KEY_ENV}"
native_responses = true

[upstreams.azure-dep]
type = "azure_openai"
{common}api_key_env = "{KEY_ENV}"
azure = {{ url_form = "deployments" }}

[upstreams.azure-token]
type = "azure_openai"
{common}azure = {{ url_form = "deployments", api_version = "2025-04-01-preview", token_file = "{token_file}" }}

[upstreams.azure-token-env]
type = "azure_openai"
{common}azure = {{ token_env = "{TOKEN_ENV}" }}

[upstreams.azure-wrong]
type = "azure_openai"
{common}api_key_env = "{WRONG_ENV}"

[models.gpt-azure]
targets = [{{ upstream = "azure", model = "gpt-4o-deploy" }}]
[models.gpt-azure-dep]
targets = [{{ upstream = "azure-dep", model = "gpt-4o-deploy" }}]
[models.gpt-azure-token]
targets = [{{ upstream = "azure-token", model = "gpt-4o-deploy" }}]
[models.gpt-azure-token-env]
targets = [{{ upstream = "azure-token-env", model = "gpt-4o-deploy" }}]
[models.gpt-azure-wrong]
targets = [{{ upstream = "azure-wrong", model = "gpt-4o-deploy" }}]
"""


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer], azure: tuple[FakeAzure, str],
       tmp_path: Path) -> GatewayServer:
    token_file = tmp_path / "entra-token"
    token_file.write_text(TOKEN + "\n")
    return make_gateway(upstreams(azure[1], token_file))


def oclient(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="sk-client", max_retries=0)


def aclient(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="sk-client", max_retries=0)


def hi(text: str = "Hello") -> Any:
    return [{"role": "user", "content": text}]


# -- the two URL forms, the key, the token ---------------------------------------------------

@pytest.mark.parametrize(("model", "path", "query"), [
    ("gpt-azure", "/openai/v1/chat/completions", ""),
    ("gpt-azure-dep", "/openai/deployments/gpt-4o-deploy/chat/completions",
     "api-version=2024-10-21")])
def test_openai_client_chats_through_either_url_form_with_the_api_key(
        gw: GatewayServer, azure: tuple[FakeAzure, str], model: str, path: str, query: str):
    with oclient(gw) as client:
        reply = client.chat.completions.create(model=model, messages=hi())
    assert reply.choices[0].message.content and reply.choices[0].finish_reason == "stop"
    seen = azure[0].seen[-1]
    assert (seen.path, seen.query, seen.credential) == (path, query, f"api-key: {KEY}")
    record = azure[0].inner.records[-1]
    assert record.json["model"] == "gpt-4o-deploy" and "authorization" not in record.headers
    # Azure's content-filter fields reach an OpenAI client as Azure sent them
    assert reply.model_extra and reply.model_extra["prompt_filter_results"][0][
        "content_filter_results"]["jailbreak"] == {"filtered": False, "detected": False}
    assert (reply.choices[0].model_extra or {})["content_filter_results"]["hate"][
        "severity"] == "safe"


def test_a_token_file_is_read_again_when_it_changes(gw: GatewayServer,
                                                    azure: tuple[FakeAzure, str],
                                                    tmp_path: Path):
    token_file = tmp_path / "entra-token"
    with oclient(gw) as client:
        client.chat.completions.create(model="gpt-azure-token", messages=hi())
        assert azure[0].seen[-1].credential == f"bearer {TOKEN}"
        assert azure[0].seen[-1].query == "api-version=2025-04-01-preview"
        token_file.write_text("an-expired-token")  # rotated (badly): the fake refuses it
        with pytest.raises(openai.AuthenticationError) as refused:
            client.chat.completions.create(model="gpt-azure-token", messages=hi())
        assert "Access token is missing, invalid" in refused.value.message
        assert refused.value.body["type"] == "authentication_error"  # type: ignore[index]
        token_file.write_text(TOKEN)
        client.chat.completions.create(model="gpt-azure-token", messages=hi())
    assert [s.credential for s in azure[0].seen] == [f"bearer {TOKEN}",
                                                     "bearer an-expired-token",
                                                     f"bearer {TOKEN}"]


def test_a_token_from_the_environment_goes_as_a_bearer_token(gw: GatewayServer,
                                                              azure: tuple[FakeAzure, str]):
    with oclient(gw) as client:
        client.chat.completions.create(model="gpt-azure-token-env", messages=hi())
    assert azure[0].seen[-1][1:4] == ("/openai/v1/chat/completions", "", f"bearer {TOKEN}")
    assert "api-key" not in azure[0].inner.records[-1].headers


def test_a_wrong_key_is_refused_by_the_fake_in_each_callers_format(
        gw: GatewayServer, azure: tuple[FakeAzure, str]):
    with oclient(gw) as client, pytest.raises(openai.AuthenticationError) as openai_error:
        client.chat.completions.create(model="gpt-azure-wrong", messages=hi())
    assert "invalid subscription key" in openai_error.value.message
    with aclient(gw) as aclient_, pytest.raises(anthropic.AuthenticationError) as claude_error:
        aclient_.messages.create(model="gpt-azure-wrong", max_tokens=16, messages=hi())
    assert claude_error.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert {s.credential for s in azure[0].seen} == {"api-key: not-the-key"}
    assert azure[0].inner.records == []  # refused before any model ran


# -- chat, stream, tools, structured output, through each client API -------------------------

def test_openai_stream_keeps_azures_filter_chunks_and_usage(gw: GatewayServer):
    with oclient(gw) as client:
        chunks = list(client.chat.completions.create(
            model="gpt-azure-dep", messages=hi(), stream=True,
            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert "prompt_filter_results" in (chunks[0].model_extra or {})
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_anthropic_client_reaches_azure_whole_and_streamed(gw: GatewayServer):
    with aclient(gw) as client:
        message = client.messages.create(model="gpt-azure", max_tokens=64, messages=hi())
        with client.messages.stream(model="gpt-azure-dep", max_tokens=64,
                                    messages=hi()) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert message.content[0].type == "text" and message.stop_reason == "end_turn"
    assert streamed and final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_tool_calls_reach_openai_and_anthropic_clients(gw: GatewayServer):
    steer = {"x-fake-tool": "1"}
    with oclient(gw) as client:
        reply = client.chat.completions.create(model="gpt-azure", messages=hi("Paris?"),
                                               tools=[TOOL], extra_headers=steer)
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and calls
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    function = TOOL["function"]
    with aclient(gw) as aclient_:
        message = aclient_.messages.create(
            model="gpt-azure-dep", max_tokens=64, messages=hi("Paris?"), extra_headers=steer,
            tools=[{"name": function["name"], "description": function["description"],
                    "input_schema": function["parameters"]}])
    assert message.stop_reason == "tool_use"
    assert [b.name for b in message.content if b.type == "tool_use"] == ["get_weather"]


class Weather(pydantic.BaseModel):
    city: str
    celsius: int


def test_structured_output_parses_into_the_schema(gw: GatewayServer,
                                                  azure: tuple[FakeAzure, str]):
    with oclient(gw) as client:
        reply = client.chat.completions.parse(model="gpt-azure-dep", messages=hi("Paris?"),
                                              response_format=Weather)
    assert isinstance(reply.choices[0].message.parsed, Weather)
    sent = azure[0].inner.records[-1].json["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "Weather"


# -- prompt caching --------------------------------------------------------------------------

def test_a_repeated_long_prefix_is_reported_cached_to_each_client(gw: GatewayServer):
    # A conversation's second turn repeats its first (a ~2k-token system prompt): Azure
    # caches prefixes of 1,024 tokens and more by itself and says so in usage.
    turn: Any = [{"role": "system", "content": LONG}, *hi()]
    with oclient(gw) as client:
        first = client.chat.completions.create(model="gpt-azure", messages=turn)
        turn += [{"role": "assistant", "content": first.choices[0].message.content},
                 *hi("And again?")]
        again = client.chat.completions.create(model="gpt-azure", messages=turn)
    assert first.usage and again.usage and again.usage.prompt_tokens_details
    assert (first.usage.prompt_tokens_details.cached_tokens or 0) == 0  # type: ignore[union-attr]
    assert again.usage.prompt_tokens_details.cached_tokens >= 1024  # type: ignore[operator]
    messages: Any = hi("First?")
    with aclient(gw) as aclient_:
        opening = aclient_.messages.create(model="gpt-azure-dep", max_tokens=32,
                                           system=LONG_TOO, messages=messages)
        messages += [{"role": "assistant", "content": opening.content},
                     *hi("Second?")]
        message = aclient_.messages.create(model="gpt-azure-dep", max_tokens=32,
                                           system=LONG_TOO, messages=messages)
    assert not opening.usage.cache_read_input_tokens
    assert (message.usage.cache_read_input_tokens or 0) >= 1024


# -- throttling and Azure's errors, in each caller's format -----------------------------------

def test_a_429_is_retried_after_azures_retry_after_ms(gw: GatewayServer,
                                                      azure: tuple[FakeAzure, str]):
    steer = {"x-fake-throttle-ms": "150", "x-fake-throttle-times": "1",
             "x-fake-key": "retry-once"}
    with oclient(gw) as client:
        reply = client.chat.completions.create(model="gpt-azure", messages=hi(),
                                               extra_headers=steer)
    assert reply.choices[0].message.content
    throttled, retried = azure[0].seen
    # no sooner than retry-after-ms said (the policy's own backoff is 1-5 ms), and by it,
    # not by the whole second of retry-after
    assert 0.15 <= retried.arrived - throttled.arrived < 0.9


def test_throttling_past_the_policy_reaches_each_client_as_a_429(gw: GatewayServer):
    steer = {"x-fake-throttle-ms": "9000"}  # past max_retry_after_ms: no retry, given back
    with oclient(gw) as client, pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="gpt-azure", messages=hi(), extra_headers=steer)
    assert limited.value.response.headers["retry-after-ms"] == "9000"
    assert limited.value.body["type"] == "rate_limit_exceeded"  # type: ignore[index]
    assert limited.value.body["code"] == "429"  # type: ignore[index]
    with aclient(gw) as client_, pytest.raises(anthropic.RateLimitError) as claude_limited:
        client_.messages.create(model="gpt-azure", max_tokens=16, messages=hi(),
                                extra_headers=steer)
    assert claude_limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert claude_limited.value.response.headers["retry-after"] == "9"


def test_a_filtered_prompt_is_a_400_in_each_callers_format(gw: GatewayServer):
    steer = {"x-fake-content-filter": "prompt"}
    with oclient(gw) as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-azure-dep", messages=hi(),
                                       extra_headers=steer)
    assert refused.value.code == "content_filter"
    body: Any = refused.value.body
    assert body["type"] == "invalid_request_error"
    assert body["innererror"]["content_filter_result"]["violence"]["filtered"] is True
    with aclient(gw) as client_, pytest.raises(anthropic.BadRequestError) as claude_refused:
        client_.messages.create(model="gpt-azure-dep", max_tokens=16, messages=hi(),
                                extra_headers=steer)
    error: Any = claude_refused.value.body
    assert error["error"]["type"] == "invalid_request_error"
    assert "content management policy" in error["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_filtered_completion_ends_as_content_filter_or_refusal(gw: GatewayServer,
                                                                 stream: bool):
    steer = {"x-fake-content-filter": "completion"}
    with oclient(gw) as client:
        if stream:
            chunks = list(client.chat.completions.create(
                model="gpt-azure", messages=hi(), extra_headers=steer, stream=True))
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            finish = client.chat.completions.create(
                model="gpt-azure", messages=hi(), extra_headers=steer).choices[0].finish_reason
    assert finish == "content_filter"
    with aclient(gw) as client_:
        if stream:
            with client_.messages.stream(model="gpt-azure", max_tokens=32, messages=hi(),
                                         extra_headers=steer) as events:
                message = events.get_final_message()
        else:
            message = client_.messages.create(model="gpt-azure", max_tokens=32,
                                              messages=hi(), extra_headers=steer)
    assert message.stop_reason == "refusal"


# -- Responses -------------------------------------------------------------------------------

def test_responses_go_natively_to_the_v1_form_and_translated_to_the_deployments_form(
        gw: GatewayServer, azure: tuple[FakeAzure, str]):
    with oclient(gw) as client:
        native = client.responses.create(model="gpt-azure", input="Hello")
        translated = client.responses.create(model="gpt-azure-dep", input="Hello")
    assert native.output_text and translated.output_text
    assert [s.path for s in azure[0].seen] == [
        "/openai/v1/responses", "/openai/deployments/gpt-4o-deploy/chat/completions"]
    assert azure[0].inner.records[0].json["input"] == "Hello"


# -- configuration ---------------------------------------------------------------------------

ENDPOINT = 'base_url = "https://r.openai.azure.com"\n'
KEYED = ENDPOINT + 'api_key_env = "K"\n'


@pytest.mark.parametrize(("table", "says"), [
    (ENDPOINT, "authenticates one way"),
    ('base_url = "https://r.openai.azure.com/openai/v1"\napi_key_env = "K"\n', "without /openai"),
    (KEYED + 'native_responses = true\nazure = { url_form = "deployments" }\n',
     "needs azure.url_form = 'v1'"),
    (ENDPOINT + 'azure = { token_env = "T", token_file = "f" }\n', "not both"),
    (KEYED + 'azure = { api_version = "v2" }\n', "not an Azure API version"),
])
def test_a_bad_azure_table_is_refused_naming_what_is_wrong(tmp_path: Path, table: str,
                                                           says: str):
    path = tmp_path / "gateway.toml"
    path.write_text(f'[upstreams.az]\ntype = "azure_openai"\n{table}')
    with pytest.raises(ConfigError, match="upstreams.az") as refused:
        load_config(path)
    assert says in str(refused.value)


def test_azure_options_on_another_type_are_refused(tmp_path: Path):
    path = tmp_path / "gateway.toml"
    path.write_text('[upstreams.o]\ntype = "openai"\nbase_url = "http://x/v1"\n'
                    'azure = { url_form = "deployments" }\n')
    with pytest.raises(ConfigError, match="azure applies to type 'azure_openai' only"):
        load_config(path)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_filtered_completion_translated_for_a_responses_client_is_incomplete(
        gw: GatewayServer, stream: bool) -> None:
    """The deployments form translates Responses to chat: a content-filtered completion is
    ``incomplete`` with reason ``content_filter``, as OpenAI's Responses API says it."""
    steer = {"x-fake-content-filter": "completion"}
    with oclient(gw) as client:
        if stream:
            events = list(client.responses.create(model="gpt-azure-dep", input="hi",
                                                  extra_headers=steer, stream=True))
            assert events[-1].type == "response.incomplete"
            response = events[-1].response
        else:
            response = client.responses.create(model="gpt-azure-dep", input="hi",
                                               extra_headers=steer)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "content_filter"
