"""/v1/responses to an upstream that serves it itself (``native_responses = true``: OpenAI;
here the fake upstream's Responses API), with the official openai SDK as the client: the
body goes untranslated, a conversation the upstream keeps is continued by its id, and one
that moves to an upstream that keeps nothing is rebuilt from the gateway's store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest
from pydantic import BaseModel

from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import GatewayServer

NATIVE = """
[upstreams.native]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/v1"
native_responses = true

[models.native]
targets = [{{ upstream = "native", model = "native-upstream-model" }}]
"""


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer], fake_server: Any) -> GatewayServer:
    return make_gateway(NATIVE.format(url=fake_server.url))


def sdk(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0)


def body(fake: FakeUpstream, i: int = -1) -> dict[str, Any]:
    sent: dict[str, Any] = orjson.loads(fake.records[i].body)
    return sent


def test_a_native_upstream_gets_the_responses_body(gw: GatewayServer,
                                                   fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        r = client.responses.create(model="native", input="Hi", instructions="Be brief.",
                                    tools=[{"type": "web_search"}], metadata={"k": "v"})
        with client.responses.stream(model="native", input="Hi") as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
    assert r.status == "completed" and r.output_text
    assert [rec.path for rec in fake.records] == ["/v1/responses"] * 2
    sent = body(fake, 0)  # as the client made it, but for the upstream's model name
    assert sent["model"] == "native-upstream-model" and sent["input"] == "Hi"
    assert sent["tools"] == [{"type": "web_search"}] and sent["metadata"] == {"k": "v"}
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_text == r.output_text
    first_log, log = gw.logged(2)[-2:]
    assert (log["api"], log["upstream"], log["status"]) == ("responses", "native", 200)
    assert r.usage is not None
    assert (first_log["prompt_tokens"], first_log["completion_tokens"]) == (
        r.usage.input_tokens, r.usage.output_tokens)
    assert first_log["finish_reason"] == log["finish_reason"] == "stop"


def test_a_conversation_the_upstream_keeps_is_continued_by_its_id(
        gw: GatewayServer, fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        one = client.responses.create(model="native", input="My name is Ada.")
        two = client.responses.create(model="native", input="My name?",
                                      previous_response_id=one.id)
        three = client.responses.create(model="native", input="Spell it.", stream=True,
                                        previous_response_id=two.id)
        done = next(e for e in three if e.type == "response.completed").response
        # the gateway kept them too: retrievable, and continued on any upstream
        assert client.responses.retrieve(done.id).previous_response_id == two.id
        four = client.responses.create(model="fake-model", input="Bye.",
                                       previous_response_id=done.id)
    assert body(fake, 1)["previous_response_id"] == one.id
    assert body(fake, 1)["input"] == "My name?"  # the upstream holds the rest
    assert body(fake, 2)["previous_response_id"] == two.id
    assert four.output_text
    moved = body(fake, 3)  # the chat-only upstream: the whole conversation rebuilt
    assert fake.records[3].path == "/v1/chat/completions"
    assert [m["role"] for m in moved["messages"]] == ["user", "assistant"] * 3 + ["user"]
    assert moved["messages"][0]["content"] == "My name is Ada."


def test_an_id_the_gateway_never_saw_is_left_to_the_native_upstream(
        gw: GatewayServer, fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="native", input="x", previous_response_id="resp_x")
        with pytest.raises(openai.BadRequestError) as chat_err:  # a chat-only model: ours
            client.responses.create(model="fake-model", input="x",
                                    previous_response_id="resp_x")
    assert err.value.code == chat_err.value.code == "previous_response_not_found"
    assert len(fake.records) == 1
    assert body(fake)["previous_response_id"] == "resp_x"


class Weather(BaseModel):
    city: str
    celsius: int


@pytest.mark.parametrize("model", ["native", "fake-model"])
def test_json_schema_output_parses(gw: GatewayServer, fake: FakeUpstream, model: str) -> None:
    with sdk(gw) as client:
        parsed = client.responses.parse(model=model, input="Weather in Paris?",
                                        text_format=Weather)
    assert isinstance(parsed.output_parsed, Weather)
    sent = body(fake)
    fmt = sent["text"]["format"] if model == "native" else sent["response_format"]
    assert fmt["type"] == "json_schema"


def test_a_function_tool_round_trip_natively(gw: GatewayServer, fake: FakeUpstream) -> None:
    tools: Any = [{"type": "function", "name": "weather", "strict": False,
                   "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}]
    with sdk(gw) as client:
        first = client.responses.create(model="native", input="Weather?", tools=tools,
                                        extra_headers={"x-fake-tool": "once"})
        [call] = [item for item in first.output if item.type == "function_call"]
        second = client.responses.create(
            model="native", tools=tools, previous_response_id=first.id,
            extra_headers={"x-fake-tool": "once"},
            input=[{"type": "function_call_output", "call_id": call.call_id,
                    "output": "Sunny"}])
    assert second.output_text
    assert body(fake)["previous_response_id"] == first.id
    assert [r["finish_reason"] for r in gw.logged(2)] == ["tool_calls", "stop"]


def test_deleting_a_native_response_deletes_the_upstreams_copy_too(
        gw: GatewayServer, fake: FakeUpstream, fake_server: Any) -> None:
    with sdk(gw) as client:
        r = client.responses.create(model="native", input="Forget this.")
        client.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(r.id)
    assert (fake.records[-1].method, fake.records[-1].path) == ("DELETE", f"/v1/responses/{r.id}")
    with openai.OpenAI(base_url=fake_server.url + "/v1", api_key="k", max_retries=0) as direct, \
            pytest.raises(openai.NotFoundError):
        direct.responses.retrieve(r.id)  # the upstream no longer has it
