"""The Gemini API upstream (``type = "gemini"``) through a running gateway: the official
openai (Chat Completions and Responses) and anthropic SDKs in front, the fake Google
(gateway.testing.fake_gemini) behind, which checks the ``x-goog-api-key`` and the request as
strictly as Google's parser and simulates Gemini's implicit prompt caching."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.testing.fake_gemini import FakeGoogle
from gateway.testing.server import ServerThread
from tests.conftest import GatewayServer

KEY_ENV = "GATEWAY_TEST_GEMINI_KEY"
KEY = "AIza-fake-gemini-key"
MODEL = "gemini-2.5-flash"
WORDS = " ".join(f"tok{i}" for i in range(8))
#: A system prompt long enough for Gemini's implicit cache (1,024 tokens; words here).
RULES = "\n".join(f"Rule {i}: answer the traveller about booking change number {i}, in full "
                  "sentences, checking the fare rules first." for i in range(100))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
          "parameters": {"type": "object", "properties": {"x": {"type": "integer"}},
                         "required": ["x"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def gemini_server() -> Iterator[tuple[FakeGoogle, str]]:
    app = FakeGoogle(gemini_key=KEY, simulate_cache=True)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def fake_gemini(gemini_server: tuple[FakeGoogle, str],
                monkeypatch: pytest.MonkeyPatch) -> FakeGoogle:
    monkeypatch.setenv(KEY_ENV, KEY)
    gemini_server[0].clear()
    return gemini_server[0]


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer], gemini_server: tuple[FakeGoogle, str],
       fake_gemini: FakeGoogle) -> GatewayServer:
    return make_gateway(gemini_toml(gemini_server[1]))


def gemini_toml(url: str) -> str:
    """Upstream ``gemini`` on the fake at ``url`` and model ``gem`` on it."""
    return f"""
[upstreams.gemini]
type = "gemini"
base_url = "{url}"
api_key_env = "{KEY_ENV}"
forward_headers = ["x-fake-*"]

[models.gem]
targets = [{{ upstream = "gemini", model = "{MODEL}" }}]
"""


def oclient(gw: GatewayServer, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0, **kw)


def aclient(gw: GatewayServer, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, **kw)


def hi() -> list[Any]:
    return [{"role": "user", "content": "hi"}]


# -- chat and streams ----------------------------------------------------------------------------

def test_an_openai_client_chats_with_gemini(gw, fake_gemini):
    with oclient(gw) as c:
        done = c.chat.completions.create(model="gem", max_tokens=100, temperature=0.5,
                                         messages=[{"role": "system", "content": "Be brief."},
                                                   *hi()])
    assert done.choices[0].message.content == WORDS
    assert done.choices[0].finish_reason == "stop" and done.model == MODEL
    assert done.usage is not None and done.usage.completion_tokens == 8
    rec = fake_gemini.records[-1]
    assert rec.path == f"/v1beta/models/{MODEL}:generateContent"
    assert rec.headers["x-goog-api-key"] == KEY and "authorization" not in rec.headers
    assert rec.json == {"systemInstruction": {"parts": [{"text": "Be brief."}]},
                        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                        "generationConfig": {"maxOutputTokens": 100, "temperature": 0.5}}


def test_streams_reach_openai_anthropic_and_responses_clients(gw, fake_gemini):
    with oclient(gw) as c:
        chunks = list(c.chat.completions.create(model="gem", messages=hi(), stream=True,
                                                stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == WORDS
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert fake_gemini.records[-1].path.endswith(f"{MODEL}:streamGenerateContent?alt=sse")
    with aclient(gw) as a, a.messages.stream(model="gem", max_tokens=64, messages=hi()) as s:
        assert "".join(s.text_stream) == WORDS
        assert s.get_final_message().stop_reason == "end_turn"
    with oclient(gw) as c:
        events = list(c.responses.create(model="gem", input="hi", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == WORDS


def test_an_anthropic_client_gets_a_messages_answer(gw, fake_gemini):
    with aclient(gw) as a:
        message = a.messages.create(model="gem", max_tokens=3, system="Be brief.",
                                    messages=hi())
    assert message.content[0].text == "tok0 tok1 tok2"  # type: ignore[union-attr]
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    assert fake_gemini.records[-1].json["generationConfig"]["maxOutputTokens"] == 3


# -- tools and structured output ------------------------------------------------------------------

def test_a_tool_loop_runs_through_function_calls_and_responses(gw, fake_gemini):
    with oclient(gw, default_headers={"x-fake-tool": "once"}) as c:
        messages: list[Any] = [{"role": "user", "content": "weather?"}]
        done = c.chat.completions.create(model="gem", messages=messages, tools=TOOLS,
                                         tool_choice="required")
        call = done.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert done.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, orjson.loads(call.function.arguments)) == \
            ("get_weather", {"x": 1})
        messages += [done.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
        final = c.chat.completions.create(model="gem", messages=messages, tools=TOOLS)
    assert final.choices[0].message.content == WORDS
    sent = fake_gemini.records[-1].json
    assert sent["contents"][1] == {"role": "model", "parts": [
        {"functionCall": {"name": "get_weather", "args": {"x": 1}}}]}
    assert sent["contents"][2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}}]
    declared = sent["tools"][0]["functionDeclarations"][0]["parameters"]
    assert declared["type"] == "OBJECT" and "additionalProperties" not in declared
    assert fake_gemini.records[-2].json["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}


def test_an_anthropic_client_gets_tool_use_blocks(gw, fake_gemini):
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {
        "x": {"type": "integer"}}}}]
    with aclient(gw, default_headers={"x-fake-tool": "1"}) as a:
        message = a.messages.create(model="gem", max_tokens=64, tools=tools,  # type: ignore[arg-type]
                                    messages=[{"role": "user", "content": "weather?"}])
    block = message.content[-1]
    assert message.stop_reason == "tool_use"
    assert (block.type, block.name, block.input) == ("tool_use", "get_weather", {"x": 1})  # type: ignore[union-attr]


def test_structured_output_follows_the_response_schema(gw, fake_gemini):
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "days": {"type": ["integer", "null"]}},
              "required": ["city", "days"], "additionalProperties": False}
    with oclient(gw) as c:
        done = c.chat.completions.create(
            model="gem", messages=[{"role": "user", "content": "where?"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "trip", "schema": schema, "strict": True}})
    assert set(orjson.loads(done.choices[0].message.content or "")) == {"city", "days"}
    config = fake_gemini.records[-1].json["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseSchema"]["properties"]["days"] == {"type": "INTEGER",
                                                               "nullable": True}


# -- implicit prompt caching ----------------------------------------------------------------------

def test_a_conversation_reads_geminis_implicit_cache(gw, fake_gemini):
    messages: list[Any] = [{"role": "system", "content": RULES}]
    cached = []
    with oclient(gw, default_headers={"x-fake-cache-scope": "conversation"}) as c:
        for turn in range(3):
            messages.append({"role": "user", "content": f"question {turn}"})
            done = c.chat.completions.create(model="gem", messages=messages)
            messages.append({"role": "assistant", "content": done.choices[0].message.content})
            assert done.usage is not None and done.usage.prompt_tokens_details is not None
            cached.append(done.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0 and all(n > 1024 for n in cached[1:])
    assert [r["cache_read_tokens"] or 0 for r in gw.logged(3)] == cached
    assert "cache_control" not in str(fake_gemini.records[-1].json)
    with aclient(gw, default_headers={"x-fake-cache-scope": "conversation"}) as a:
        message = a.messages.create(model="gem", max_tokens=64, system=RULES, messages=[
            {"role": "user", "content": "question 0"}])
    assert message.usage.cache_read_input_tokens and message.usage.cache_read_input_tokens > 1024


# -- safety, errors, throttling, keys ------------------------------------------------------------

def test_safety_stops_and_blocked_prompts_read_as_content_filter(gw, fake_gemini):
    with oclient(gw, default_headers={"x-fake-finish": "SAFETY"}) as c:
        stopped = c.chat.completions.create(model="gem", messages=hi())
    assert stopped.choices[0].finish_reason == "content_filter"
    with oclient(gw, default_headers={"x-fake-block": "1"}) as c:
        blocked = c.chat.completions.create(model="gem", messages=hi())
        chunks = list(c.chat.completions.create(model="gem", messages=hi(), stream=True))
    assert blocked.choices[0].finish_reason == "content_filter"
    assert blocked.choices[0].message.refusal == "Gemini blocked the prompt (SAFETY)"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "content_filter"


def test_throttling_and_overload_reach_each_client_in_its_own_format(gw, fake_gemini):
    steer = {"x-fake-google-status": "429", "x-fake-retry-after": "0"}
    with oclient(gw, default_headers=steer) as c, pytest.raises(openai.RateLimitError) as o:
        c.chat.completions.create(model="gem", messages=hi())
    assert o.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    assert o.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    with aclient(gw, default_headers={**steer, "x-fake-google-status": "503"}) as a, \
            pytest.raises(anthropic.APIStatusError) as caught:
        a.messages.create(model="gem", max_tokens=8, messages=hi())
    assert caught.value.status_code == 529
    assert caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert len(fake_gemini.records) == 6  # each retried up to the policy's 3 attempts


def test_what_gemini_cannot_do_is_refused_before_it_is_sent(gw, fake_gemini):
    with oclient(gw) as c, pytest.raises(openai.BadRequestError) as caught:
        c.chat.completions.create(model="gem", messages=hi(), n=2)
    assert caught.value.code == "unsupported_value" and "Gemini" in caught.value.message
    assert fake_gemini.records == []


def test_a_wrong_api_key_is_refused_by_the_fake_as_google_does(make_gateway, gemini_server,
                                                               fake_gemini, monkeypatch):
    url = gemini_server[1] + f"/v1beta/models/{MODEL}:generateContent"
    r = httpx.post(url, json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert r.status_code == 403 and r.json()["error"]["status"] == "PERMISSION_DENIED"
    monkeypatch.setenv(KEY_ENV, "AIza-wrong")
    gw = make_gateway(f"""
[upstreams.gemini]
type = "gemini"
base_url = "{gemini_server[1]}"
api_key_env = "{KEY_ENV}"

[models.gem]
targets = [{{ upstream = "gemini", model = "{MODEL}" }}]
""")
    with oclient(gw) as c, pytest.raises(openai.AuthenticationError) as caught:
        c.chat.completions.create(model="gem", messages=hi())
    assert "API key not valid" in caught.value.message
    assert fake_gemini.records[-1].headers["x-goog-api-key"] == "AIza-wrong"


def test_an_error_mid_stream_reaches_the_client_as_its_error_event(gw, fake_gemini):
    with oclient(gw, default_headers={"x-fake-error-midway": "3"}) as c, \
            pytest.raises(openai.APIError, match="overloaded"):
        for _ in c.chat.completions.create(model="gem", messages=hi(), stream=True):
            pass
    with aclient(gw, default_headers={"x-fake-error-midway": "3"}) as a, \
            pytest.raises(anthropic.APIStatusError) as caught, \
            a.messages.stream(model="gem", max_tokens=64, messages=hi()) as s:
        "".join(s.text_stream)
    assert caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
