"""The fake OpenAI upstream's Responses API (gateway/testing/fake_responses.py), with the
official openai SDK straight against it: the wire format the SDK parses, the kept state
(previous_response_id, retrieve, delete, input items) and the steering the gateway's tests
lean on (x-fake-tool: once, structured outputs), on the chat side too."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import orjson
import pytest
from pydantic import BaseModel

from gateway.testing.fake_responses import json_instance
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import FakeServer

TEXT = "w0 w1 w2 w3 w4 w5 w6 w7"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}, "strict": False}


@pytest.fixture
def client(fake_server: FakeServer, fake: FakeUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake_server.url + "/v1", api_key="k", max_retries=0) as c:
        yield c


def test_a_response_is_a_message_with_its_usage(client: openai.OpenAI,
                                                fake: FakeUpstream) -> None:
    r = client.responses.create(model="gpt-x", input="Say hi", instructions="Be brief.",
                                max_output_tokens=20, metadata={"k": "v"})
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert [part.type for part in item.content] == ["output_text"]
    assert r.output_text == TEXT
    assert r.usage is not None
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (4, 8, 12)
    assert (r.model, r.instructions, r.max_output_tokens, r.metadata) == (
        "gpt-x", "Be brief.", 20, {"k": "v"})
    [sent] = fake.records
    assert (sent.method, sent.path) == ("POST", "/v1/responses")
    assert sent.json["input"] == "Say hi"


def test_a_stream_is_the_typed_events_in_order(client: openai.OpenAI) -> None:
    with client.responses.stream(model="gpt-x", input="Hi",
                                 extra_headers={"x-fake-tokens": "3"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") \
        == "w0 w1 w2"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert final.output_text == "w0 w1 w2" and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens == 3


def test_responses_chain_by_previous_response_id_and_are_kept(client: openai.OpenAI) -> None:
    first = client.responses.create(model="gpt-x", input="My name is Ann.")
    second = client.responses.create(model="gpt-x", input="What is my name?",
                                     previous_response_id=first.id)
    third = client.responses.create(model="gpt-x", input="Spell it.",
                                    previous_response_id=second.id)
    assert second.previous_response_id == first.id and third.previous_response_id == second.id
    # Each turn reads the conversation before it: 4 words asked, 8 answered, 4, 8, then 2.
    assert [r.usage.input_tokens for r in (first, second, third) if r.usage] == [4, 16, 26]
    kept = client.responses.retrieve(second.id)
    assert (kept.id, kept.output_text, kept.previous_response_id) == (second.id, TEXT, first.id)
    [item] = client.responses.input_items.list(second.id).data
    assert item.type == "message" and item.content[0].text == "What is my name?"  # type: ignore[union-attr]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="gpt-x", input="Again?", previous_response_id=first.id)
    assert err.value.status_code == 400 and err.value.code == "previous_response_not_found"
    assert err.value.param == "previous_response_id"


def test_a_response_not_stored_is_not_kept(client: openai.OpenAI) -> None:
    r = client.responses.create(model="gpt-x", input="Forget me.", store=False)
    assert r.output_text == TEXT
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_tool_once_calls_until_a_tool_result_is_in_the_conversation(
        client: openai.OpenAI) -> None:
    once = {"x-fake-tool": "once"}
    first = client.responses.create(model="gpt-x", input="Weather in Paris?", tools=[WEATHER],  # type: ignore[list-item]
                                    extra_headers=once)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert orjson.loads(call.arguments) == {"x": 1} and call.call_id.startswith("call_")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
    # the whole conversation sent again ...
    again = client.responses.create(
        model="gpt-x", tools=[WEATHER], extra_headers=once, input=[  # type: ignore[list-item]
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments}, result])  # type: ignore[list-item]
    # ... or only the result, after the kept response
    chained = client.responses.create(model="gpt-x", tools=[WEATHER], extra_headers=once,  # type: ignore[list-item]
                                      input=[result], previous_response_id=first.id)  # type: ignore[list-item]
    assert again.output_text == chained.output_text == TEXT
    # Any other value calls every time, as before; x-fake-tool-args are its arguments.
    always = client.responses.create(model="gpt-x", tools=[WEATHER], input=[result],  # type: ignore[list-item]
                                     previous_response_id=first.id, extra_headers={
                                         "x-fake-tool": "1",
                                         "x-fake-tool-args": '{"city": "Paris"}'})
    [call] = always.output
    assert call.type == "function_call" and call.arguments == '{"city": "Paris"}'



def test_a_function_call_streams_its_argument_deltas(client: openai.OpenAI) -> None:
    with client.responses.stream(model="gpt-x", input="Weather?", tools=[WEATHER],  # type: ignore[list-item]
                                 extra_headers={"x-fake-tool": "once"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert events[2].item.type == "function_call" and events[2].item.name == "get_weather"  # type: ignore[union-attr]
    [call] = final.output
    assert call.type == "function_call" and orjson.loads(call.arguments) == {"x": 1}


def test_chat_tool_once_answers_text_after_a_tool_message(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": {"type": "object"}}}]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model="m", messages=ask, tools=tools,  # type: ignore[arg-type]
        extra_headers={"x-fake-tool": "once", "x-fake-tool-args": '{"city": "Paris"}'})
    [call] = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.type == "function" and call.function.arguments == '{"city": "Paris"}'
    answered = [*ask, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "Sunny"}]
    second = client.chat.completions.create(model="m", messages=answered, tools=tools,  # type: ignore[arg-type]
                                            extra_headers={"x-fake-tool": "once"})
    assert second.choices[0].message.content == TEXT
    stream = client.chat.completions.create(model="m", messages=answered, tools=tools,  # type: ignore[arg-type]
                                            stream=True, extra_headers={"x-fake-tool": "once"})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == TEXT


class City(BaseModel):
    name: str
    population: int
    capital: bool
    districts: list[str]


class Forecast(BaseModel):
    city: City
    summary: str | None
    celsius: float


def test_structured_outputs_parse(client: openai.OpenAI) -> None:
    r = client.responses.parse(model="gpt-x", input="Forecast?", text_format=Forecast)
    assert r.output_parsed == Forecast(city=City(name="", population=0, capital=False,
                                                 districts=[]), summary="", celsius=0.0)
    with client.responses.stream(model="gpt-x", input="Forecast?", text_format=Forecast,
                                 extra_headers={"x-fake-tokens": "5"}) as stream:
        deltas = [e for e in stream if e.type == "response.output_text.delta"]
        streamed = stream.get_final_response()
    assert len(deltas) == 5 and streamed.output_parsed == r.output_parsed
    chat = client.chat.completions.parse(model="m", response_format=Forecast, messages=[
        {"role": "user", "content": "Forecast?"}])
    assert chat.choices[0].message.parsed == r.output_parsed


def test_json_instance_follows_the_schema() -> None:
    schema = {"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"},
        "kind": {"enum": ["a", "b"]}, "tag": {"type": "string", "minLength": 2},
        "n": {"type": "integer", "minimum": 3}, "odd": {"type": "integer",
                                                      "exclusiveMinimum": 0},
        "maybe": {"type": ["null", "number"]}, "two": {"type": "array", "minItems": 2,
                                                        "items": {"type": "boolean"}},
        "ref": {"$ref": "#/$defs/Leaf"}}, "$defs": {"Leaf": {"const": 7}}}
    assert json_instance(schema) == {"when": "1970-01-01T00:00:00Z", "kind": "a", "tag": "xx",
                                     "n": 3, "odd": 1, "maybe": 0.0, "two": [False, False],
                                     "ref": 7}


def test_steering_headers_apply_to_responses(client: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as err:
        client.responses.create(model="gpt-x", input="x", extra_headers={
            "x-fake-status": "429", "x-fake-error-code": "rate_limit_exceeded"})
    assert err.value.code == "rate_limit_exceeded"
    cut = client.responses.create(model="gpt-x", input="x", extra_headers={
        "x-fake-finish": "length", "x-fake-usage": "0"})
    assert cut.status == "incomplete" and cut.usage is None
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model="gpt-x", input="x", stream=True,
                                          extra_headers={"x-fake-finish": "length"}))
    assert events[-1].type == "response.incomplete"
    with pytest.raises(openai.APIError):
        list(client.responses.create(model="gpt-x", input="x", stream=True,
                                     extra_headers={"x-fake-die-after": "2"}))


def test_a_client_that_leaves_is_seen_by_the_fake(client: openai.OpenAI,
                                                  fake: FakeUpstream) -> None:
    stream = client.responses.create(model="gpt-x", input="x", stream=True, extra_headers={
        "x-fake-tokens": "100000", "x-fake-itl-ms": "1"})
    for event in stream:
        if event.type == "response.output_text.delta":
            break
    stream.close()
    [rec] = fake.wait_for(lambda recs: recs if recs and recs[0].disconnected else None)
    assert rec.chunks_sent < 100000
