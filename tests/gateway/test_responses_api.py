"""/v1/responses through the gateway, with the official openai SDK as the client, served by
an OpenAI-style upstream through its chat endpoint (the fake upstream here) and by an
Anthropic upstream (the fake Anthropic)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import openai
import orjson
import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import GatewayServer
from tests.gateway.cache.test_cache_gateway import CACHE_POLICY, MEMORY, bag_of_words, stored


def sdk(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0)


def test_a_response_is_answered_through_the_chat_endpoint(gw: GatewayServer,
                                                          fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        r = client.responses.create(model="fake-model", input="Say hi.",
                                    instructions="Be brief.", max_output_tokens=20)
    assert r.status == "completed" and r.output_text == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert r.usage is not None and r.usage.output_tokens > 0
    assert (r.instructions, r.max_output_tokens) == ("Be brief.", 20)  # echoed, as OpenAI does
    [sent] = fake.records
    assert sent.path == "/v1/chat/completions"
    body = orjson.loads(sent.body)
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Say hi."}]
    assert body["max_completion_tokens"] == 20
    log = gw.logged(1)[-1]
    assert (log["route"], log["api"], log["status"]) == ("/v1/responses", "responses", 200)


def test_a_response_streams_as_typed_events(gw: GatewayServer, fake: FakeUpstream) -> None:
    with sdk(gw) as client, client.responses.stream(model="fake-model", input="Hi",
                                                     metadata={"k": "v"}) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.metadata == {"k": "v"}
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 8
    assert final.output_text == "w0 w1 w2 w3 w4 w5 w6 w7"


def test_a_bad_request_is_a_400_in_openai_shape(gw: GatewayServer, fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        with pytest.raises(openai.BadRequestError) as err:  # a tool type no one knows
            client.responses.create(model="fake-model", input="x",
                                    tools=[{"type": "teleport"}])  # type: ignore[list-item]
        assert err.value.body is not None and "teleport" in str(err.value.body)
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="fake-model", input=3)  # type: ignore[arg-type]
    assert fake.records == []


def test_a_chat_clients_cached_answer_serves_a_responses_client(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(MEMORY, policy=CACHE_POLICY, embed=bag_of_words)
    with sdk(gw) as client:
        chat = client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "What is 2 + 2?"}])
        stored(gw)
        r = client.responses.with_raw_response.create(model="fake-model",
                                                      input="What is 2 + 2?")
        streamed = client.responses.create(model="fake-model", input="What is 2 + 2?",
                                           stream=True)
        events = list(streamed)
    assert r.headers["x-cache"] == "hit"
    assert r.parse().output_text == chat.choices[0].message.content
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == chat.choices[0].message.content
    assert len(fake.records) == 1


def test_a_function_tool_round_trip(gw: GatewayServer, fake: FakeUpstream) -> None:
    tools = [{"type": "function", "name": "weather", "description": "The weather in a city.",
              "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
              "strict": False}]
    with sdk(gw) as client:
        first = client.responses.with_raw_response.create(
            model="fake-model", input="Weather in Paris?", tools=tools,  # type: ignore[arg-type]
            extra_headers={"x-fake-tool": "1"}).parse()
        [call] = first.output
        assert call.type == "function_call" and call.name == "weather"
        assert call.arguments == '{"x": 1}' or orjson.loads(call.arguments) == {"x": 1}
        second = client.responses.create(
            model="fake-model", tools=tools, input=[  # type: ignore[arg-type]
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": call.call_id, "name": call.name,
                 "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}])
    assert second.output_text == "w0 w1 w2 w3 w4 w5 w6 w7"
    sent = orjson.loads(fake.records[-1].body)
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
    assert sent["messages"][1]["tool_calls"][0]["id"] == call.call_id
    assert sent["tools"][0]["function"]["name"] == "weather"


# -- served by an Anthropic upstream: Responses -> chat -> Messages, and back ----------------

def test_an_anthropic_upstream_serves_a_response(
        with_claude: tuple[GatewayServer, FakeAnthropic]) -> None:
    gw, claude = with_claude
    with sdk(gw) as client:
        r = client.responses.create(model="claude", input="Say hi", instructions="Be brief.")
        with client.responses.stream(model="claude", input="Say hi") as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
    assert r.status == "completed" and r.output_text == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    assert r.usage is not None and r.usage.output_tokens > 0
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_text == r.output_text
    sent = orjson.loads(claude.records[0].body)
    assert sent["system"] == "Be brief." and sent["messages"][0]["role"] == "user"
    assert sent["model"] == "claude-upstream" and sent["max_tokens"] > 0


def test_a_client_that_leaves_mid_stream_cancels_the_upstream(gw: GatewayServer,
                                                               fake: FakeUpstream) -> None:
    async def go() -> None:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
            stream = await c.responses.create(
                model="fake-model", input="Count to 500.", stream=True,
                extra_headers={"x-fake-tokens": "500", "x-fake-itl-ms": "20"})
            async for event in stream:
                if event.type == "response.output_text.delta":
                    break
            await stream.close()
    asyncio.run(go())
    fake.wait_for(lambda recs: bool(recs) and recs[0].disconnected is not None)
    [rec] = gw.logged()
    assert rec["cancelled"] is True and rec["api"] == "responses"
