"""The OpenAI format module, pure: request bodies checked at the door, answers rendered and
read back (JSON body and chunk stream, parsed with the openai SDK's own types), errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.errors import (
    GatewayError,
    InvalidJSON,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    UpstreamTimeout,
)
from gateway.formats.answer import Answer
from gateway.formats.openai import (
    AnswerCollector,
    answer_from_completion,
    completion_body,
    completion_events,
    error_body,
    error_event,
    parse_request,
    with_usage_option,
)
from gateway.formats.openai_stream import StreamObserver
from tests.gateway.formats.translation import parsed

HI = [{"role": "user", "content": "hi"}]

# --- parse_request ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "body"), [
    ("chat", {"model": "m", "messages": HI}),
    ("chat", {"model": "m", "messages": [{"role": "system", "content": "be brief"}, *HI],
              "stream": True, "stream_options": {"include_usage": True}, "temperature": 2,
              "top_p": 0.0, "max_tokens": 1, "n": 1, "stop": ["\n", "END"],
              "presence_penalty": -2.0, "seed": 7, "new_api_field": {"kept": [1, 2]}}),
    ("chat", {"model": "m", "messages": HI, "stop": "END", "temperature": None}),
    ("completions", {"model": "m", "prompt": "Once upon"}),
    ("completions", {"model": "m", "prompt": ["a", "b"], "stream": False, "max_tokens": 16}),
    ("embeddings", {"model": "m", "input": "text"}),
    ("embeddings", {"model": "m", "input": ["a", "b"], "stream": False}),
])
def test_valid_bodies_come_back_as_the_same_dict(kind, body):
    assert parse_request(orjson.dumps(body), kind) == body


def chat(**fields: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": HI, **fields})


@pytest.mark.parametrize(("kind", "raw", "error", "code", "param"), [
    ("chat", orjson.dumps({"messages": HI}), InvalidRequest, "missing_required_parameter",
     "model"),
    ("chat", chat(model=5), InvalidRequest, "invalid_type", "model"),
    ("chat", chat(model=""), InvalidRequest, "invalid_type", "model"),
    ("chat", orjson.dumps({"model": "m"}), InvalidRequest, "missing_required_parameter",
     "messages"),
    ("chat", chat(messages=[]), InvalidRequest, "invalid_value", "messages"),
    ("chat", chat(messages="hi"), InvalidRequest, "invalid_type", "messages"),
    ("chat", chat(messages=["hi"]), InvalidRequest, "invalid_type", "messages[0]"),
    ("chat", chat(messages=[*HI, {"content": "no role"}]), InvalidRequest, "invalid_type",
     "messages[1].role"),
    ("completions", orjson.dumps({"model": "m"}), InvalidRequest,
     "missing_required_parameter", "prompt"),
    ("completions", orjson.dumps({"model": "m", "prompt": 3}), InvalidRequest, "invalid_type",
     "prompt"),
    ("embeddings", orjson.dumps({"model": "m"}), InvalidRequest, "missing_required_parameter",
     "input"),
    ("embeddings", orjson.dumps({"model": "m", "input": "x", "stream": True}), InvalidRequest,
     "invalid_request", "stream"),
    ("chat", chat(stream="yes"), InvalidRequest, "invalid_type", "stream"),
    ("chat", chat(stream_options="usage"), InvalidRequest, "invalid_type", "stream_options"),
    ("chat", chat(temperature=2.5), InvalidRequest, "invalid_value", "temperature"),
    ("chat", chat(temperature=True), InvalidRequest, "invalid_value", "temperature"),
    ("chat", chat(temperature="hot"), InvalidRequest, "invalid_value", "temperature"),
    ("chat", chat(top_p=1.5), InvalidRequest, "invalid_value", "top_p"),
    ("chat", chat(top_p=-0.1), InvalidRequest, "invalid_value", "top_p"),
    ("chat", chat(max_tokens=0), InvalidRequest, "invalid_value", "max_tokens"),
    ("chat", chat(max_tokens=True), InvalidRequest, "invalid_value", "max_tokens"),
    ("chat", chat(max_tokens=1.5), InvalidRequest, "invalid_value", "max_tokens"),
    ("chat", chat(stop=5), InvalidRequest, "invalid_type", "stop"),
    ("chat", chat(stop=["a", 1]), InvalidRequest, "invalid_type", "stop"),
    ("chat", b'{"model": "m",', InvalidJSON, "invalid_json", None),
    ("chat", b"", InvalidJSON, "invalid_json", None),
    ("chat", b'[{"model": "m"}]', InvalidRequest, "invalid_request", None),
    ("embeddings", b'"text"', InvalidRequest, "invalid_request", None),
])
def test_invalid_bodies_are_rejected_naming_the_field(kind, raw, error, code, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_request(raw, kind)
    exc = caught.value
    assert type(exc) is error
    assert (exc.status, exc.type, exc.code, exc.param) == (400, "invalid_request_error", code,
                                                           param)
    if param is not None:
        assert param.split("[")[0] in exc.message


# --- answers ---------------------------------------------------------------------------------

UNICODE = "café €5 😀 " * 20  # 200 characters: four content chunks of at most 64
TOOL_CALLS = [{"id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
TEXT_ANSWERS = [
    Answer("Hello!", "stop", "fake-upstream-model", None, 12, 3),
    Answer(UNICODE, "stop", "m", None, 40, 200),
    Answer("", "stop", "m", None, 5, 0),
]
ANSWERS = [*TEXT_ANSWERS, Answer(None, "tool_calls", "m", TOOL_CALLS, 30, 9),
           Answer("Let me look.", "tool_calls", "m", TOOL_CALLS, 7, 2)]


@pytest.mark.parametrize("answer", [*ANSWERS, Answer("no usage known", "stop", "m")])
def test_stored_bytes_round_trip(answer):
    assert Answer.from_bytes(answer.to_bytes()) == answer


@pytest.mark.parametrize("answer", ANSWERS)
def test_completion_body_round_trips_and_parses_with_the_sdk(answer):
    body = completion_body(answer, "chatcmpl-test")
    assert answer_from_completion(parsed(body), allow_tools=True) == answer
    completion = ChatCompletion.model_validate_json(body)
    assert completion.id == "chatcmpl-test" and completion.model == answer.model
    choice = completion.choices[0]
    assert choice.finish_reason == answer.finish_reason
    assert choice.message.content == answer.content
    calls = choice.message.tool_calls or []
    assert [c.model_dump(exclude_none=True) for c in calls] == (answer.tool_calls or [])
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == answer.prompt_tokens
    assert completion.usage.completion_tokens == answer.completion_tokens


def replay(events: bytes, step: int = 7) -> tuple[StreamObserver, AnswerCollector, bytes]:
    """Feed a stream to the observer in small pieces, as a network would cut it, and the
    whole events it lets out to the collector."""
    observer, collector, out = StreamObserver(), AnswerCollector(), b""
    for i in range(0, len(events), step):
        block = observer.feed(events[i:i + step])
        collector.feed(block)
        out += block
    rest = observer.flush()
    collector.feed(rest)
    return observer, collector, out + rest


def sdk_chunks(events: bytes) -> list[ChatCompletionChunk]:
    lines = [e.removeprefix(b"data: ") for e in events.split(b"\n\n") if e]
    assert lines[-1] == b"[DONE]" and lines.count(b"[DONE]") == 1
    return [ChatCompletionChunk.model_validate_json(line) for line in lines[:-1]]


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("answer", TEXT_ANSWERS)
def test_chunk_stream_round_trips_through_observer_and_collector(answer, include_usage):
    events = completion_events(answer, include_usage, "chatcmpl-test")
    observer, collector, out = replay(events)
    assert out == events and observer.done and not observer.errored
    assert observer.finish_reason == "stop"
    rebuilt = collector.answer(observer.finish_reason, observer.usage)
    if include_usage:
        assert rebuilt == answer
    else:
        assert observer.usage is None
        assert rebuilt == dataclasses.replace(answer, prompt_tokens=None,
                                              completion_tokens=None)


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("answer", ANSWERS)
def test_chunk_stream_parses_with_the_sdk(answer, include_usage):
    chunks = sdk_chunks(completion_events(answer, include_usage, "chatcmpl-test"))
    assert {c.id for c in chunks} == {"chatcmpl-test"}
    assert {c.model for c in chunks} == {answer.model}
    usage_only = [c for c in chunks if not c.choices]
    assert len(usage_only) == (1 if include_usage else 0)
    if include_usage:
        assert chunks[-1] is usage_only[0] and chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens == answer.prompt_tokens
        assert chunks[-1].usage.completion_tokens == answer.completion_tokens
    choices = [c.choices[0] for c in chunks if c.choices]
    assert choices[0].delta.role == "assistant"
    assert [c.finish_reason for c in choices] == [None] * (len(choices) - 1) + [
        answer.finish_reason]
    text = [c.delta.content for c in choices if c.delta.content]
    assert "".join(text) == (answer.content or "")
    assert all(len(piece) <= 64 for piece in text)
    calls = [t for c in choices for t in c.delta.tool_calls or ()]
    assert [t.function.name for t in calls if t.function] == [
        t["function"]["name"] for t in answer.tool_calls or ()]


def test_long_unicode_content_is_split_over_several_chunks_and_rejoins_exactly():
    answer = TEXT_ANSWERS[1]
    chunks = sdk_chunks(completion_events(answer, False))
    text = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(text) == 4 and len(text[0]) == 64
    assert "".join(text) == UNICODE


def completion(**changes: Any) -> dict[str, Any]:
    body = orjson.loads(completion_body(Answer("hi", "stop", "m", None, 1, 1)))
    body["choices"][0].update(changes)
    return body


@pytest.mark.parametrize("raw", [
    orjson.dumps({"error": {"message": "boom", "type": "server_error", "param": None,
                            "code": None}}),
    orjson.dumps(completion(finish_reason="length")),
    orjson.dumps(completion(finish_reason="content_filter")),
    orjson.dumps({**completion(), "choices": completion()["choices"] * 2}),
    orjson.dumps({**completion(), "choices": []}),
    orjson.dumps(completion(message={"role": "assistant", "content": None})),
    orjson.dumps(completion(message={"role": "assistant", "content": None,
                                     "tool_calls": TOOL_CALLS}, finish_reason="tool_calls")),
    orjson.dumps(completion(message={"role": "assistant", "content": "hi",
                                     "tool_calls": TOOL_CALLS})),
    b'{"choices": [',
    b"[]",
])
def test_answers_that_must_not_be_kept(raw):
    assert answer_from_completion(parsed(raw), allow_tools=False) is None


def test_tool_calls_are_kept_only_when_allowed():
    raw = orjson.dumps({**completion(message={"role": "assistant", "content": None,
                                              "tool_calls": TOOL_CALLS},
                                     finish_reason="tool_calls")})
    assert answer_from_completion(parsed(raw), allow_tools=False) is None
    assert answer_from_completion(parsed(raw), allow_tools=True) == Answer(
        None, "tool_calls", "m", TOOL_CALLS, 1, 1)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "expected"), [
    (InvalidRequest("'top_p' must be a number", param="top_p", code="invalid_value"),
     {"message": "'top_p' must be a number", "type": "invalid_request_error",
      "param": "top_p", "code": "invalid_value"}),
    (InvalidJSON("request body is not valid JSON"),
     {"message": "request body is not valid JSON", "type": "invalid_request_error",
      "param": None, "code": "invalid_json"}),
    (ModelNotFound("no such model", param="model"),
     {"message": "no such model", "type": "invalid_request_error", "param": "model",
      "code": "model_not_found"}),
    (UpstreamTimeout("the upstream did not answer in time"),
     {"message": "the upstream did not answer in time", "type": "upstream_error",
      "param": None, "code": "upstream_timeout"}),
    (Overloaded("busy", reason="queue_full", retry_after_s=1.0),
     {"message": "busy", "type": "overloaded_error", "param": None, "code": "degraded_mode"}),
    (GatewayError("internal gateway error"),
     {"message": "internal gateway error", "type": "server_error", "param": None,
      "code": "internal_error"}),
])
def test_errors_render_as_openai_error_objects(error, expected):
    assert orjson.loads(error_body(error)) == {"error": expected}
    event = error_event(error)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert orjson.loads(event.removeprefix(b"data: ")) == {"error": expected}
    observer = StreamObserver()
    assert observer.feed(event) == event and observer.errored and not observer.done


def test_with_usage_option_splices_the_option_into_the_clients_bytes():
    for raw in (b'{"model":"m","stream":true,"messages":[]}',
                b' \n{ "model": "m", "stream": true, "messages": [{"role": "user"}] }'):
        out = with_usage_option(raw)
        assert orjson.loads(out) == {**orjson.loads(raw),
                                     "stream_options": {"include_usage": True}}
        assert out.endswith(raw.lstrip()[1:])  # the rest byte for byte
