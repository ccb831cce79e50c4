"""The gateway as a drop-in Anthropic endpoint, and both APIs crossing over: the official
``anthropic`` and ``openai`` SDKs in front, the fake Anthropic and OpenAI upstreams behind.

Pairs covered: anthropic client -> Anthropic upstream (native, untranslated), anthropic
client -> OpenAI-compatible upstream, openai client -> Anthropic upstream (and, in
test_local_upstream.py, anthropic client -> the local engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import anthropic
import httpx
import openai
import orjson
import pytest
from anthropic._constants import ANTHROPIC_API_VERSION

from gateway.requestlog import FIELDS
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.server import ServerThread
from tests.conftest import DEFAULT_POLICY
from tests.gateway.cache.test_cache_gateway import CACHE_POLICY, MEMORY, bag_of_words
from tests.gateway.routing.test_routing import (
    EASY,
    HARD,
    MODELS,
    constant_embed,
    routing_policy,
    tiny_artifact,
)

KEY_ENV = "GATEWAY_TEST_ANTHROPIC_KEY"
UPSTREAM_KEY = "sk-ant-upstream"
TEXT = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
OPENAI_TEXT = "w0 w1 w2 w3 w4 w5 w6 w7"
HELLO = [{"role": "user", "content": "Say hi"}]
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="session")
def anthropic_server() -> Iterator[tuple[FakeAnthropic, str]]:
    app = FakeAnthropic(api_key=UPSTREAM_KEY)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def claude(anthropic_server: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    anthropic_server[0].clear()
    return anthropic_server[0]


@pytest.fixture
def make(make_gateway: Callable[..., object], anthropic_server: tuple[FakeAnthropic, str],
         monkeypatch: pytest.MonkeyPatch) -> Callable[..., object]:
    monkeypatch.setenv(KEY_ENV, UPSTREAM_KEY)
    url = anthropic_server[1]
    extra = f"""
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "{url}"
api_key_env = "{KEY_ENV}"
read_timeout_ms = 2000

[upstreams.claude_down]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:9"
connect_timeout_ms = 200

[models.claude]
targets = [{{ upstream = "claude", model = "claude-upstream" }}]

[models."claude-or-gpt"]
targets = [{{ upstream = "claude_down", model = "claude-x" }},
           {{ upstream = "fake", model = "fake-upstream-model" }}]
"""

    def build(more: str = "", **kw: object) -> object:
        return make_gateway(extra + more, **kw)
    return build


@pytest.fixture
def gw(make: Callable[..., object]) -> object:
    return make()


def aclient(gw, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="sk-client", max_retries=0, **kw)


def oclient(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="sk-client", max_retries=0)


# -- anthropic client -> Anthropic upstream: native, nothing translated ---------------------

def test_native_request_goes_through_intact_and_the_answer_back(make, claude):
    # With the prompt_cache stage off (it reorders and marks: tests/gateway/
    # test_prompt_cache_stage.py), the native request goes through byte for byte.
    gw = make(policy=DEFAULT_POLICY + "\n[prompt_cache]\nenabled = false\n")
    body = {
        "model": "claude", "max_tokens": 64,
        "system": [{"type": "text", "text": "You are terse.",
                    "cache_control": {"type": "ephemeral"}}],
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?",
                                          "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                 "input": {"city": "Lyon"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "21C"}]}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "stop_sequences": ["END"], "metadata": {"user_id": "u-1"},
    }
    raw = orjson.dumps(body)
    r = httpx.post(gw.url + "/v1/messages", content=raw,
                   headers={"x-api-key": "sk-client", "anthropic-version": "2023-06-01",
                            "content-type": "application/json",
                            "x-fake-cache-read": "100", "x-fake-cache-write": "20"})
    assert r.status_code == 200, r.text
    message = anthropic.types.Message.model_validate_json(r.content)
    assert message.content[0].text == TEXT and message.model == "claude-upstream"
    assert message.usage.cache_read_input_tokens == 100
    [seen] = claude.records
    # Byte for byte, but for the model: key order, cache_control, thinking blocks kept.
    assert seen.body == raw.replace(b'"model":"claude"', b'"model":"claude-upstream"')
    assert seen.headers["x-api-key"] == UPSTREAM_KEY  # never the client's key
    assert seen.headers["anthropic-version"] == "2023-06-01"
    [rec] = gw.logged()
    assert set(rec) == set(FIELDS)
    assert rec["api"] == "anthropic" and rec["route"] == "/v1/messages"
    assert rec["status"] == 200 and rec["upstream"] == "claude"
    assert rec["cache_read_tokens"] == 100 and rec["cache_write_tokens"] == 20
    assert rec["prompt_tokens"] == message.usage.input_tokens + 120
    assert rec["completion_tokens"] == 8 and rec["finish_reason"] == "stop"


def test_native_sdk_create_and_stream(gw, claude):
    with aclient(gw) as c:
        m = c.messages.create(model="claude", max_tokens=32, messages=HELLO)
        assert m.content[0].text == TEXT and m.stop_reason == "end_turn"
        with c.messages.stream(model="claude", max_tokens=32, messages=HELLO,
                               extra_headers={"x-fake-cache-read": "7"}) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert text == TEXT and final.usage.cache_read_input_tokens == 7
    assert final.usage.output_tokens == 8
    recs = gw.logged(2)
    assert recs[1]["stream"] is True and recs[1]["ttft_ms"] is not None
    assert recs[1]["cache_read_tokens"] == 7 and recs[1]["completion_tokens"] == 8
    # The client's anthropic-version goes through (it knows the shape it speaks).
    assert claude.records[1].headers["anthropic-version"] == ANTHROPIC_API_VERSION


def test_the_gateway_key_is_accepted_as_x_api_key_or_bearer(make, claude):
    import hashlib
    digest = hashlib.sha256(b"gw-key").hexdigest()
    gw = make(f'\n[[auth.keys]]\nid = "team"\nsha256 = "{digest}"\n')
    with anthropic.Anthropic(base_url=gw.url, api_key="gw-key", max_retries=0) as c:
        assert c.messages.create(model="claude", max_tokens=8, messages=HELLO).content
    with anthropic.Anthropic(base_url=gw.url, auth_token="gw-key", max_retries=0) as c:
        assert c.messages.create(model="claude", max_tokens=8, messages=HELLO).content
    with anthropic.Anthropic(base_url=gw.url, api_key="wrong", max_retries=0) as c, \
            pytest.raises(anthropic.AuthenticationError) as err:
        c.messages.create(model="claude", max_tokens=8, messages=HELLO)
    assert err.value.body["error"]["type"] == "authentication_error"


def test_native_tool_use_round_trip(gw, claude):
    with aclient(gw) as c:
        first = c.messages.create(model="claude", max_tokens=64, messages=HELLO,
                                  tools=[WEATHER], extra_headers={"x-fake-tool": "1"})
        assert first.stop_reason == "tool_use"
        call = next(b for b in first.content if b.type == "tool_use")
        second = c.messages.create(model="claude", max_tokens=64, tools=[WEATHER], messages=[
            *HELLO, {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": "18C"}]}])
    assert second.content[0].text == TEXT


# -- errors, in the caller's format ---------------------------------------------------------

def test_errors_are_anthropic_errors_on_v1_messages(gw, claude):
    with aclient(gw) as c:
        with pytest.raises(anthropic.NotFoundError) as nf:
            c.messages.create(model="nope", max_tokens=8, messages=HELLO)
        assert nf.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.BadRequestError) as bad:
            c.messages.create(model="claude", max_tokens=0, messages=HELLO)
        assert "max_tokens" in bad.value.message
        with pytest.raises(anthropic.RateLimitError):  # the upstream's own, passed on
            c.messages.create(model="claude", max_tokens=8, messages=HELLO,
                              extra_headers={"x-fake-status": "429",
                                             "x-fake-retry-after": "60"})
        with pytest.raises(anthropic.InternalServerError) as down:  # 503 -> 529 here
            c.messages.create(model="needs-key", max_tokens=8, messages=HELLO)
        assert down.value.status_code == 529
        assert down.value.body["error"]["type"] == "overloaded_error"
    r = httpx.post(gw.url + "/v1/messages", content=b"{nope")
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_an_upstream_error_midway_ends_the_stream_with_an_error_event(gw, claude):
    with aclient(gw) as c, pytest.raises(anthropic.APIStatusError) as err, \
            c.messages.stream(model="claude", max_tokens=32, messages=HELLO,
                              extra_headers={"x-fake-error-midway": "3"}) as stream:
        for _ in stream.text_stream:
            pass
    assert "Overloaded" in str(err.value)
    [rec] = gw.logged()
    assert rec["error_type"] == "overloaded_error"


def test_errors_are_openai_errors_when_an_openai_client_calls_claude(gw, claude):
    with oclient(gw) as c:
        with pytest.raises(openai.BadRequestError) as bad:
            c.chat.completions.create(model="claude", messages=HELLO, n=2)
        assert bad.value.body["param"] == "n" and "'n'" in bad.value.message
        with pytest.raises(openai.BadRequestError) as upstream_400:
            c.chat.completions.create(model="claude", messages=HELLO,
                                      extra_headers={"x-fake-status": "400"})
        assert upstream_400.value.body["type"] == "invalid_request_error"
        with pytest.raises(openai.InternalServerError) as overloaded:  # 529 -> 503 here
            c.chat.completions.create(model="claude", messages=HELLO,
                                      extra_headers={"x-fake-status": "529",
                                                     "x-fake-retry-after": "60"})
        assert overloaded.value.status_code == 503


def test_an_openai_client_streaming_from_claude_gets_an_error_event_when_it_breaks(gw, claude):
    midway = {"x-fake-error-midway": "3"}
    with oclient(gw) as c:
        stream = c.chat.completions.create(model="claude", messages=HELLO, stream=True,
                                           extra_headers=midway)
        text = []
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                text.extend(ch.delta.content or "" for ch in chunk.choices)
        with c.chat.completions.with_streaming_response.create(
                model="claude", messages=HELLO, stream=True, extra_headers=midway) as raw:
            events = [line for line in raw.iter_lines() if line]
    assert "".join(text) == "tok0 tok1 tok2"  # what came before the break, then the error
    assert "Overloaded" in err.value.message
    assert raw.status_code == 200
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert last["error"]["type"] == "overloaded_error"
    assert "data: [DONE]" not in events  # a broken stream never looks finished
    recs = gw.logged(2)
    assert [r["error_type"] for r in recs] == ["overloaded_error"] * 2  # the upstream's own
    assert [r["api"] for r in recs] == ["openai"] * 2


def test_unsupported_features_are_refused_by_name(gw, claude, fake):
    with aclient(gw) as c, pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model="fake-model", max_tokens=8, messages=HELLO,
                          tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "server tool 'web_search_20250305'" in err.value.message
    r = httpx.post(gw.v1 + "/completions", json={"model": "claude", "prompt": "hi"})
    assert r.status_code == 400 and "Anthropic" in r.json()["error"]["message"]
    assert not claude.records and not fake.records


# -- anthropic client -> OpenAI-compatible upstream ---------------------------------------

def test_anthropic_client_to_an_openai_upstream(gw, fake):
    with aclient(gw) as c:
        m = c.messages.create(model="fake-model", max_tokens=32, system="Be brief.",
                              messages=HELLO, stop_sequences=["END"])
        with c.messages.stream(model="fake-model", max_tokens=32, messages=HELLO) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert m.content[0].text == OPENAI_TEXT and m.stop_reason == "end_turn"
    assert m.usage.output_tokens == 8 and m.model == "fake-upstream-model"
    sent = fake.records[0].json
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["max_tokens"] == 32 and sent["stop"] == ["END"]
    assert text == OPENAI_TEXT and final.usage.output_tokens == 8
    assert fake.records[1].json["stream_options"] == {"include_usage": True}
    recs = gw.logged(2)
    assert [r["api"] for r in recs] == ["anthropic", "anthropic"]
    assert recs[1]["completion_tokens"] == 8 and recs[1]["finish_reason"] == "stop"


def test_anthropic_client_falls_back_from_claude_to_an_openai_model(gw, fake):
    with aclient(gw) as c:
        m = c.messages.create(model="claude-or-gpt", max_tokens=16, messages=HELLO)
    assert m.content[0].text == OPENAI_TEXT and m.model == "fake-upstream-model"
    assert fake.records[0].path == "/v1/chat/completions"


def test_anthropic_client_tool_round_trip_through_an_openai_upstream(gw, fake):
    with aclient(gw) as c:
        first = c.messages.create(model="fake-model", max_tokens=64, messages=HELLO,
                                  tools=[WEATHER], extra_headers={"x-fake-tool": "1"})
        assert first.stop_reason == "tool_use"
        call = next(b for b in first.content if b.type == "tool_use")
        assert call.name == "get_weather" and call.input == {"x": 1}
        second = c.messages.create(model="fake-model", max_tokens=64, tools=[WEATHER],
                                   messages=[*HELLO, {"role": "assistant",
                                                      "content": first.content},
                                             {"role": "user", "content": [
                                                 {"type": "tool_result", "tool_use_id": call.id,
                                                  "content": "18C"}]}])
        with c.messages.stream(model="fake-model", max_tokens=64, messages=HELLO,
                               tools=[WEATHER], extra_headers={"x-fake-tool": "1"}) as stream:
            streamed = stream.get_final_message()
    assert second.content[0].text == OPENAI_TEXT
    [use] = streamed.content
    assert use.type == "tool_use" and use.input == {"x": 1}
    assert streamed.stop_reason == "tool_use"
    sent = fake.records[1].json["messages"]
    assert sent[1]["tool_calls"][0]["id"] == call.id
    assert sent[2] == {"role": "tool", "tool_call_id": call.id, "content": "18C"}


# -- openai client -> Anthropic upstream ----------------------------------------------------

def test_openai_client_to_claude(gw, claude):
    with oclient(gw) as c:
        r = c.chat.completions.create(
            model="claude", messages=[{"role": "system", "content": "Be brief."}, *HELLO],
            extra_headers={"x-fake-cache-read": "50"})
        chunks = list(c.chat.completions.create(
            model="claude", messages=HELLO, stream=True,
            stream_options={"include_usage": True}, extra_headers={"x-fake-cache-read": "5"}))
        hidden = list(c.chat.completions.create(model="claude", messages=HELLO, stream=True))
    assert r.choices[0].message.content == TEXT and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens_details.cached_tokens == 50
    assert r.usage.prompt_tokens >= 50 and r.usage.completion_tokens == 8
    sent = claude.records[0].json
    assert sent["system"] == "Be brief." and sent["max_tokens"] == 4096  # the policy default
    assert list(sent)[:2] == ["model", "max_tokens"]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == TEXT and chunks[-1].usage.prompt_tokens_details.cached_tokens == 5
    assert all(ch.choices for ch in hidden)  # no usage chunk unless asked
    recs = gw.logged(3)
    assert [r["api"] for r in recs] == ["openai"] * 3
    assert recs[1]["cache_read_tokens"] == 5 and recs[2]["completion_tokens"] == 8


def test_openai_client_tool_round_trip_with_claude(gw, claude):
    tool = {"type": "function", "function": {"name": "get_weather",
                                             "parameters": WEATHER["input_schema"]}}
    with oclient(gw) as c:
        first = c.chat.completions.create(model="claude", messages=HELLO, tools=[tool],
                                          extra_headers={"x-fake-tool": "1"})
        [call] = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "get_weather" and orjson.loads(
            call.function.arguments) == {"x": 1}
        streamed = list(c.chat.completions.create(model="claude", messages=HELLO, tools=[tool],
                                                  stream=True,
                                                  extra_headers={"x-fake-tool": "1"}))
        second = c.chat.completions.create(model="claude", tools=[tool], messages=[
            *HELLO, first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "18C"}])
    args = "".join(d.function.arguments or "" for ch in streamed if ch.choices
                   for d in ch.choices[0].delta.tool_calls or ())
    assert orjson.loads(args) == {"x": 1}
    assert second.choices[0].message.content == TEXT
    result = claude.records[2].json["messages"][-1]
    assert result["role"] == "user" and result["content"][0]["type"] == "tool_result"


# -- every stage, on both surfaces -------------------------------------------------------------

def test_a_cache_hit_is_served_in_the_callers_format(make, claude):
    gw = make('\n[cache]\nenabled = true\nbackend = "memory"\nsemantic = false\n',
              policy='version = "t"\n[cache]\nenabled = true\n')
    with aclient(gw) as c:
        first = c.messages.create(model="claude", max_tokens=32, messages=HELLO)
        raw = c.messages.with_raw_response.create(model="claude", max_tokens=32,
                                                  messages=HELLO)
        with c.messages.stream(model="claude", max_tokens=32, messages=HELLO) as stream:
            streamed = stream.get_final_message()
    hit = raw.parse()
    assert raw.headers["x-cache"] == "hit" and hit.content[0].text == first.content[0].text
    assert streamed.content[0].text == TEXT
    assert len(claude.records) == 1
    recs = gw.logged(3)
    assert [r["cache"] for r in recs] == ["miss", "hit", "hit"]


@pytest.mark.parametrize(("model", "upstream"), [("claude", "claude"), ("fake-model", "fake")],
                         ids=["native", "translated"])
def test_client_disconnect_cancels_the_upstream(gw, request, model, upstream):
    upstream = request.getfixturevalue(upstream)

    async def go() -> None:
        async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="k",
                                            max_retries=0) as c, \
                c.messages.stream(model=model, max_tokens=64, messages=HELLO,
                                  extra_headers={"x-fake-tokens": "500",
                                                 "x-fake-itl-ms": "20"}) as stream:
            async for _ in stream.text_stream:
                break
    asyncio.run(go())
    upstream.wait_for(lambda recs: recs and recs[0].disconnected is not None)
    [rec] = gw.logged()
    assert rec["cancelled"] is True and rec["api"] == "anthropic"


#: One request at a time per upstream, none waiting: a second one is shed.
ONE_SLOT = "\n[admission]\nmax_concurrency = 1\nmax_queue = 0\n"


async def _hold_the_slot(gw, claude, text: str = "hold the only slot"):
    """A request that holds the Claude upstream's only slot until released (cancelled: the
    fake stops waiting when its client leaves); returns once the fake has it."""
    client = httpx.AsyncClient(timeout=30)
    task = asyncio.create_task(client.post(
        gw.url + "/v1/messages", headers={"x-fake-ttft-ms": "30000"},
        json={"model": "claude", "max_tokens": 32,
              "messages": [{"role": "user", "content": text}]}))
    await asyncio.to_thread(claude.wait_for, lambda recs: any(
        r.json["messages"][0]["content"] == text for r in recs))

    async def release() -> None:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.aclose()
    return release


async def test_a_shed_request_is_a_529_overloaded_error_for_the_anthropic_sdk(make, claude):
    gw = make(policy=DEFAULT_POLICY + ONE_SLOT)
    release = await _hold_the_slot(gw, claude)
    try:
        async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0) as c:
            with pytest.raises(anthropic.OverloadedError) as err:
                await c.messages.create(model="claude", max_tokens=32, messages=HELLO)
    finally:
        await release()
    assert err.value.status_code == 529
    assert err.value.body["error"]["type"] == "overloaded_error"
    headers = err.value.response.headers
    assert headers["x-gateway-degraded"] == "queue_full" and int(headers["retry-after"]) >= 1
    assert len(claude.records) == 1  # the shed request never reached the upstream
    shed = [r for r in gw.logged(2) if r["shed"]]
    assert [(r["api"], r["status"], r["shed"]) for r in shed] == [
        ("anthropic", 529, "queue_full")]


async def test_a_shed_request_is_served_a_relaxed_cache_hit_as_an_anthropic_message(
        make, claude):
    policy = CACHE_POLICY + ONE_SLOT + '[degraded]\nactions = ["cache", "reject"]\n'
    gw = make(MEMORY, policy=policy, embed=bag_of_words)
    ask = {"model": "claude", "max_tokens": 32}
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0) as c:
        first = await c.messages.create(**ask, messages=[
            {"role": "user", "content": "what is the capital city of france"}])
        await asyncio.to_thread(gw.run, gw.gateway.cache.drain())
        release = await _hold_the_slot(gw, claude)
        try:
            near = [{"role": "user", "content": "capital of france"}]  # relaxed hit only
            raw = await c.messages.with_raw_response.create(**ask, messages=near)
            async with c.messages.stream(**ask, messages=near) as stream:
                streamed = await stream.get_final_message()
            with pytest.raises(anthropic.OverloadedError) as err:
                await c.messages.create(**ask, messages=[
                    {"role": "user", "content": "something else entirely"}])
        finally:
            await release()
    hit = await raw.parse()
    assert raw.headers["x-cache"] == "hit"
    assert raw.headers["x-gateway-degraded"] == "cache:queue_full"
    assert hit.type == "message" and hit.content[0].text == first.content[0].text == TEXT
    assert streamed.content[0].text == TEXT and streamed.stop_reason == "end_turn"
    assert err.value.response.headers["x-gateway-degraded"] == "queue_full"
    assert len(claude.records) == 2  # the first request and the one holding the slot
    shed = sorted(r["shed"] for r in gw.logged(5) if r["shed"])
    assert shed == ["cache:queue_full", "cache:queue_full", "queue_full"]


def test_a_router_alias_serves_an_anthropic_client_from_either_tier(make, claude, fake,
                                                                  tmp_path):
    artifact = tiny_artifact(tmp_path / "tiny.npz")
    gw = make(MODELS, policy=routing_policy(artifact, tiers='small = ["small-model"]\n'
                                                           'large = ["claude"]'),
              embed=constant_embed)
    with aclient(gw) as c:
        hard = c.messages.with_raw_response.create(
            model="auto", max_tokens=32, messages=[{"role": "user", "content": HARD}])
        easy = c.messages.with_raw_response.create(
            model="auto", max_tokens=32, messages=[{"role": "user", "content": EASY}])
    assert hard.headers["x-route-tier"] == "large"
    native = hard.parse()  # Claude, untranslated
    assert native.model == "claude-upstream" and native.content[0].text == TEXT
    assert easy.headers["x-route-tier"] == "small"
    translated = easy.parse()  # the OpenAI-compatible small model, answered as a message
    assert translated.model == "small-upstream" and translated.content[0].text == OPENAI_TEXT
    assert translated.stop_reason == "end_turn" and translated.usage.output_tokens == 8
    assert [r.json["model"] for r in claude.records] == ["claude-upstream"]
    assert [r.path for r in fake.records] == ["/v1/chat/completions"]
    recs = gw.logged(2)
    assert [(r["api"], r["router"], r["route_tier"]) for r in recs] == [
        ("anthropic", "auto", "large"), ("anthropic", "auto", "small")]


# -- count_tokens and models ----------------------------------------------------------------

def test_count_tokens(gw, claude):
    with aclient(gw) as c:
        counted = c.messages.count_tokens(model="claude", messages=HELLO)
        estimated = c.messages.with_raw_response.count_tokens(model="fake-model",
                                                              messages=HELLO)
    assert counted.input_tokens > 0
    assert claude.records[0].path == "/v1/messages/count_tokens"
    assert claude.records[0].json["model"] == "claude-upstream"
    assert estimated.headers["x-gateway-token-count"] == "estimate"
    assert estimated.parse().input_tokens > 0


@pytest.mark.parametrize("body", [{"messages": []}, {"model": 7, "messages": []}])
def test_count_tokens_without_a_model_name_is_a_clear_400(gw, body):
    r = httpx.post(gw.url + "/v1/messages/count_tokens", json=body,
                   headers={"anthropic-version": ANTHROPIC_API_VERSION})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "model" in r.json()["error"]["message"]
    assert gw.logged(1)[0]["status"] == 400


def test_models_list_in_either_format(gw):
    with aclient(gw) as c:
        names = [m.id for m in c.models.list()]
    assert "claude" in names and "fake-model" in names
    with oclient(gw) as o:
        assert "claude" in [m.id for m in o.models.list()]


def test_529_and_429_from_anthropic_are_retried(gw, claude):
    with aclient(gw) as c:
        m = c.messages.create(model="claude", max_tokens=8, messages=HELLO, extra_headers={
            "x-fake-fail-times": "2", "x-fake-key": "retry-529"})
        assert m.content[0].text == TEXT
        m = c.messages.create(model="claude", max_tokens=8, messages=HELLO, extra_headers={
            "x-fake-fail-times": "1", "x-fake-status": "429", "x-fake-retry-after": "0",
            "x-fake-key": "retry-429"})
        assert m.content[0].text == TEXT
    assert len(claude.records) == 5
    assert [r["retries"] for r in gw.logged(2)] == [2, 1]
