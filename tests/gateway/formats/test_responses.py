"""The Responses wire format and its translation to Chat Completions, table by table; every
``response`` object made is validated by the openai SDK's own model of it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response

from gateway.errors import InvalidRequest, UpstreamError
from gateway.formats.answer import Answer
from gateway.formats.responses import (
    answer_from_response,
    chat_view,
    input_messages,
    parse_request,
    response_object,
)
from gateway.formats.responses_to_openai import chat_request, response_from_chat


def parse(body: dict[str, Any]) -> dict[str, Any]:
    return parse_request(orjson.dumps({"model": "m", **body}))


@pytest.mark.parametrize(("body", "param"), [
    ({}, "input"),
    ({"input": 3}, "input"),
    ({"input": [3]}, "input[0]"),
    ({"input": [{"type": "magic"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 1}]}, "input[0].content"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": "hi", "instructions": 1}, "instructions"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "hi", "tools": {}}, "tools"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": True}, "max_output_tokens"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "stream": "yes"}, "stream"),
])
def test_a_bad_request_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse(body)
    assert err.value.status == 400 and err.value.param == param


def test_input_items_become_chat_messages() -> None:
    body = parse({"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use metric units."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What is in "},
            {"type": "input_text", "text": "this image?"}]},
        {"role": "user", "content": [
            {"type": "input_text", "text": "and this?"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": {"ok": True}},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
    ]})
    assert input_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use metric units."},
        {"role": "user", "content": "What is in this image?"},
        {"role": "user", "content": [
            {"type": "text", "text": "and this?"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f",
                                                          "arguments": "{\"a\":1}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "{\"ok\":true}"},
        {"role": "assistant", "content": "Done."},
    ]
    assert input_messages(parse({"input": "Hello"})) == [{"role": "user", "content": "Hello"}]


def test_the_chat_view_reads_like_a_chat_request() -> None:
    view = chat_view(parse({"input": "Hi", "instructions": "S", "max_output_tokens": 9,
                            "temperature": 0.2}))
    assert view == {"model": "m", "messages": [{"role": "system", "content": "S"},
                                               {"role": "user", "content": "Hi"}],
                    "max_completion_tokens": 9, "temperature": 0.2}


def test_a_request_goes_up_as_a_chat_request() -> None:
    body = parse({
        "input": "Weather in Paris?", "instructions": "S", "stream": True,
        "tools": [{"type": "function", "name": "weather", "description": "d",
                   "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"},
                            "strict": True}},
        "temperature": 0.5, "top_p": 0.9, "prompt_cache_key": "k", "store": False,
        "metadata": {"a": "b"}, "reasoning": {"effort": "low"},
    })
    assert chat_request(body, "smollm2", 256) == {
        "model": "smollm2",
        "messages": [{"role": "system", "content": "S"},
                     {"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "function", "function": {
            "name": "weather", "description": "d", "parameters": {"type": "object"},
            "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "w", "schema": {"type": "object"}, "strict": True}},
        "temperature": 0.5, "top_p": 0.9, "prompt_cache_key": "k",
        "stream": True, "stream_options": {"include_usage": True},
    }
    assert chat_request(parse({"input": "x", "max_output_tokens": 7,
                               "text": {"format": {"type": "json_object"}}}), "m", 256) == {
        "model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7,
        "response_format": {"type": "json_object"}}


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0]"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
])
def test_what_chat_cannot_express_is_a_400(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        chat_request(parse({"input": "x", **body}), "m", 256)
    assert err.value.param == param


def test_an_input_image_by_file_id_is_a_400() -> None:
    with pytest.raises(InvalidRequest) as err:
        input_messages(parse({"input": [{"role": "user", "content": [
            {"type": "input_image", "file_id": "file_1"}]}]}))
    assert err.value.param == "input[0].content[0]"


def chat_completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "smollm2",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                      "prompt_tokens_details": {"cached_tokens": 8}}}


def test_a_chat_answer_comes_back_as_a_response() -> None:
    request = parse({"input": "Hi", "instructions": "S", "metadata": {"a": "b"}})
    out = response_from_chat(chat_completion({"content": "Hello!"}), request)
    r = Response.model_validate(out)
    assert (r.status, r.output_text, r.model, r.instructions) == (
        "completed", "Hello!", "smollm2", "S")
    assert r.usage is not None and (r.usage.input_tokens, r.usage.output_tokens,
                                    r.usage.input_tokens_details.cached_tokens) == (11, 3, 8)
    assert r.metadata == {"a": "b"} and r.id.startswith("resp_")


def test_tool_calls_come_back_as_function_call_items() -> None:
    out = response_from_chat(chat_completion({"content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather",
                                                          "arguments": "{\"city\":\"Paris\"}"}}
    ]}, "tool_calls"))
    r = Response.model_validate(out)
    [item] = r.output
    assert item.type == "function_call"
    assert (item.call_id, item.name, item.arguments) == ("call_1", "weather",
                                                         "{\"city\":\"Paris\"}")


def test_a_cut_answer_is_incomplete_and_a_broken_one_a_502() -> None:
    r = Response.model_validate(response_from_chat(chat_completion({"content": "Hel"},
                                                                   "length")))
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    with pytest.raises(UpstreamError):
        response_from_chat({"choices": []})


@pytest.mark.parametrize("answer", [
    Answer("Paris.", "stop", "m", None, 5, 2),
    Answer(None, "tool_calls", "m", [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "{}"}}], 5, 2),
])
def test_an_answer_survives_the_round_trip(answer: Answer) -> None:
    obj = response_object(answer)
    Response.model_validate(obj)
    assert answer_from_response(obj, allow_tools=True) == answer


def test_only_a_completed_response_is_kept() -> None:
    obj = response_object(Answer("x", "stop", "m"))
    assert answer_from_response({**obj, "status": "incomplete"}, True) is None
    tools = response_object(Answer(None, "tool_calls", "m", [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]))
    assert answer_from_response(tools, allow_tools=False) is None
    assert answer_from_response("not a response", True) is None


def test_a_stream_broken_midway_ends_with_response_failed_of_the_created_response() -> None:
    from gateway.errors import UpstreamStalled
    from gateway.formats.responses_stream import StreamObserver, failure_event, response_events

    answer = Answer.complete("Hello there", "stop", "m", None, None, False)
    assert answer is not None
    whole = response_events(answer, {"model": "m", "input": "hi", "stream": True}, "r1")
    events = whole.split(b"\n\n")[:-1]
    observer = StreamObserver()
    sent = [observer.feed(e + b"\n\n") for e in events[:5]]  # created ... the first delta
    assert b"response.output_text.delta" in sent[-1]
    name, _, data = failure_event(observer, UpstreamStalled("stalled", reason="idle")
                                  ).partition(b"\ndata: ")
    assert name == b"event: response.failed"
    event = orjson.loads(data)
    assert event["sequence_number"] == 5  # after the five sent, numbered from 0
    created = orjson.loads(events[0].partition(b"data: ")[2])["response"]
    failed = Response.model_validate(event["response"])  # the SDK's own shape, strictly
    assert failed.id == created["id"] and failed.status == "failed"
    assert failed.error is not None and failed.error.code == "server_error"
    assert failed.error.message == "stalled"


def test_a_stream_broken_before_its_response_was_created_ends_with_an_error_event() -> None:
    from gateway.formats.responses_stream import StreamObserver, failure_event

    name, _, data = failure_event(StreamObserver(), UpstreamError("cut")).partition(b"\n")
    assert name == b"event: error" and orjson.loads(data[6:])["type"] == "error"
