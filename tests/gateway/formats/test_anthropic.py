"""The Anthropic format modules, pure: request bodies checked at the door, answers rendered and
read back (a Messages body and an event stream, read by the anthropic SDK's own client over a
mock transport), errors in Anthropic's shape, and a recorded stream observed on its way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from gateway.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidJSON,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    NoUpstreamAvailable,
    Overloaded,
    PermissionDenied,
    RequestTooLarge,
    TenantLimited,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.formats.answer import Answer
from gateway.formats.anthropic import (
    AnswerCollector,
    StreamObserver,
    answer_from_message,
    chat_view,
    error_body,
    error_event,
    error_status,
    error_type,
    error_type_of,
    message_body,
    message_events,
    parse_request,
    usage_to_openai,
)
from gateway.formats.chat_text import final_user_text, last_user_text
from llm_wire.sse import EventReader
from tests.gateway.formats.translation import parsed

HI = [{"role": "user", "content": "hi"}]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 64, "messages": HI, **fields}


def raw(**fields: Any) -> bytes:
    return orjson.dumps(body(**fields))


# --- parse_request ---------------------------------------------------------------------------


@pytest.mark.parametrize("request_body", [
    body(),
    body(max_tokens=1, stream=True, temperature=0, top_p=1, top_k=0, metadata={"user_id": "u"},
         stop_sequences=["\n\nHuman:", "END"], system="be brief"),
    body(system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
         messages=[{"role": "user", "content": [
             {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
             {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                          "data": "iVBORw0KGgo="}}]},
             {"role": "assistant", "content": [
                 {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
             {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]}]),
    body(tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
         tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}),
    body(tool_choice={"type": "auto"}, thinking={"type": "enabled", "budget_tokens": 1024},
         new_api_field={"kept": [1, 2]}, temperature=None, top_k=None),
    body(tool_choice={"type": "none"}, messages=[*HI, {"role": "assistant", "content": ""}]),
    body(tool_choice={"type": "any"}, temperature=0.5, top_p=0.25),
])
def test_valid_bodies_come_back_as_the_same_dict(request_body):
    assert parse_request(orjson.dumps(request_body)) == request_body


@pytest.mark.parametrize(("request_raw", "error", "code", "param"), [
    (b'{"model": "m",', InvalidJSON, "invalid_json", None),
    (b"", InvalidJSON, "invalid_json", None),
    (b'[{"model": "m"}]', InvalidRequest, "invalid_request", None),
    # what could not be sent on as it came (orjson: 254 levels written at most; an integer
    # past 64 bits read as a float)
    (raw()[:-1] + b', "tool_choice": ' + b"[" * 300 + b"]" * 300 + b"}", InvalidRequest,
     "invalid_value", None),
    (raw()[:-1] + b', "top_k": -100000000000000000000}', InvalidRequest, "invalid_value",
     None),
    (orjson.dumps({"max_tokens": 1, "messages": HI}), InvalidRequest,
     "missing_required_parameter", "model"),
    (raw(model=""), InvalidRequest, "invalid_type", "model"),
    (raw(model=3), InvalidRequest, "invalid_type", "model"),
    (orjson.dumps({"model": "m", "messages": HI}), InvalidRequest,
     "missing_required_parameter", "max_tokens"),
    (raw(max_tokens=None), InvalidRequest, "missing_required_parameter", "max_tokens"),
    (raw(max_tokens=0), InvalidRequest, "invalid_value", "max_tokens"),
    (raw(max_tokens=True), InvalidRequest, "invalid_value", "max_tokens"),
    (raw(max_tokens=1.5), InvalidRequest, "invalid_value", "max_tokens"),
    (raw(max_tokens="64"), InvalidRequest, "invalid_value", "max_tokens"),
    (orjson.dumps({"model": "m", "max_tokens": 1}), InvalidRequest,
     "missing_required_parameter", "messages"),
    (raw(messages=[]), InvalidRequest, "invalid_value", "messages"),
    (raw(messages="hi"), InvalidRequest, "invalid_type", "messages"),
    (raw(messages=["hi"]), InvalidRequest, "invalid_type", "messages[0]"),
    (raw(messages=[*HI, {"content": "no role"}]), InvalidRequest,
     "missing_required_parameter", "messages[1].role"),
    (raw(messages=[{"role": 1, "content": "x"}]), InvalidRequest, "invalid_type",
     "messages[0].role"),
    (raw(messages=[*HI, {"role": ["system"], "content": "x"}]), InvalidRequest,
     "invalid_type", "messages[1].role"),
    (raw(messages=[{"role": "user"}]), InvalidRequest, "missing_required_parameter",
     "messages[0].content"),
    (raw(messages=[{"role": "user", "content": 5}]), InvalidRequest, "invalid_type",
     "messages[0].content"),
    (raw(messages=[{"role": "user", "content": ["hi"]}]), InvalidRequest, "invalid_type",
     "messages[0].content[0]"),
    (raw(messages=[{"role": "user", "content": [{"text": "hi"}]}]), InvalidRequest,
     "invalid_type", "messages[0].content[0].type"),
    (raw(system=5), InvalidRequest, "invalid_type", "system"),
    (raw(system=["be brief"]), InvalidRequest, "invalid_type", "system[0]"),
    (raw(system=[{"type": "image"}]), InvalidRequest, "invalid_value", "system[0].type"),
    (raw(system=[{"type": "text"}]), InvalidRequest, "invalid_type", "system[0].text"),
    (raw(stream="yes"), InvalidRequest, "invalid_type", "stream"),
    (raw(temperature=1.5), InvalidRequest, "invalid_value", "temperature"),
    (raw(temperature=True), InvalidRequest, "invalid_value", "temperature"),
    (raw(temperature="hot"), InvalidRequest, "invalid_value", "temperature"),
    (raw(top_p=-0.1), InvalidRequest, "invalid_value", "top_p"),
    (raw(top_k=-1), InvalidRequest, "invalid_value", "top_k"),
    (raw(top_k=2.5), InvalidRequest, "invalid_value", "top_k"),
    (raw(stop_sequences="END"), InvalidRequest, "invalid_type", "stop_sequences"),
    (raw(stop_sequences=["END", 1]), InvalidRequest, "invalid_type", "stop_sequences[1]"),
    (raw(tools={"name": "f"}), InvalidRequest, "invalid_type", "tools"),
    (raw(tools=["f"]), InvalidRequest, "invalid_type", "tools[0]"),
    (raw(tool_choice="auto"), InvalidRequest, "invalid_type", "tool_choice"),
    (raw(tool_choice={}), InvalidRequest, "missing_required_parameter", "tool_choice.type"),
    (raw(tool_choice={"type": "required"}), InvalidRequest, "invalid_value",
     "tool_choice.type"),
    (raw(tool_choice={"type": "tool"}), InvalidRequest, "missing_required_parameter",
     "tool_choice.name"),
    (raw(tool_choice={"type": "tool", "name": 1}), InvalidRequest, "invalid_type",
     "tool_choice.name"),
    (raw(metadata=[]), InvalidRequest, "invalid_type", "metadata"),
])
def test_invalid_bodies_are_rejected_naming_the_field(request_raw, error, code, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_request(request_raw)
    exc = caught.value
    assert type(exc) is error
    assert (exc.status, exc.code, exc.param) == (400, code, param)
    if param is not None:
        assert param in exc.message
        assert param in orjson.loads(error_body(exc))["error"]["message"]


#: Claude Code's requests under the mid-conversation-system-2026-04-07 beta: system-role
#: messages inside ``messages``, after a user turn (its instructions, reminders).
MID_SYSTEM = [*HI, {"role": "system", "content": "Plan mode is on."}]


@pytest.mark.parametrize("messages", [
    MID_SYSTEM,
    [*HI, {"role": "system", "content": [{"type": "text", "text": "Terse mode."}]},
     {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}],
    [{"role": "system", "content": "first"}, *HI],  # where it may sit: the upstream says
    [*HI, {"role": "developer", "content": "a role Anthropic does not know: its own 400"}],
])
def test_system_role_messages_and_unknown_roles_pass_the_door_as_they_came(messages):
    request = body(messages=messages)
    assert parse_request(orjson.dumps(request)) == request


# --- chat_view -------------------------------------------------------------------------------

BLOCKS = [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]


@pytest.mark.parametrize(("system", "head"), [
    (None, []),
    ("be brief", [{"role": "system", "content": "be brief"}]),
    (BLOCKS, [{"role": "system", "content": BLOCKS}]),
])
def test_chat_view_puts_the_system_prompt_first_and_shares_the_messages(system, head):
    request = body(temperature=0.2) if system is None else body(temperature=0.2, system=system)
    view = chat_view(request)
    assert view == {"model": "claude-x", "max_tokens": 64, "temperature": 0.2,
                    "messages": [*head, *HI]}
    assert view["messages"][-1] is request["messages"][0]
    assert request == (body(temperature=0.2) if system is None
                       else body(temperature=0.2, system=system))  # left untouched


def test_chat_view_keeps_a_mid_conversation_system_message_in_place():
    view = chat_view(body(system="be brief", messages=MID_SYSTEM))
    assert view["messages"] == [{"role": "system", "content": "be brief"}, *MID_SYSTEM]
    assert final_user_text(view["messages"]) is None  # the last turn is no user's: exact only
    assert last_user_text(view["messages"]) == "hi"  # what the router reads


# --- errors ----------------------------------------------------------------------------------


def shed() -> Overloaded:
    return Overloaded("the gateway is shedding load", reason="queue_full", retry_after_s=1.0)


@pytest.mark.parametrize(("error", "status", "kind", "sdk_error"), [
    (InvalidRequest("'top_p' must be a number", param="top_p"), 400, "invalid_request_error",
     anthropic.BadRequestError),
    (InvalidJSON("request body is not valid JSON"), 400, "invalid_request_error",
     anthropic.BadRequestError),
    (RequestTooLarge("request body over 32 MiB"), 413, "request_too_large",
     anthropic.RequestTooLargeError),
    (AuthenticationFailed("invalid x-api-key"), 401, "authentication_error",
     anthropic.AuthenticationError),
    (PermissionDenied("this key may not use that model"), 403, "permission_error",
     anthropic.PermissionDeniedError),
    (ModelNotFound("model 'nope' not found", param="model"), 404, "not_found_error",
     anthropic.NotFoundError),
    (NotFound("no such route"), 404, "not_found_error", anthropic.NotFoundError),
    (UpstreamError("the upstream answered 500"), 502, "api_error",
     anthropic.InternalServerError),
    (UpstreamUnreachable("cannot connect"), 502, "api_error", anthropic.InternalServerError),
    (UpstreamTimeout("the upstream did not answer in time"), 504, "timeout_error",
     anthropic.InternalServerError),
    (NoUpstreamAvailable("every upstream is down"), 529, "overloaded_error",
     anthropic.OverloadedError),
    (shed(), 529, "overloaded_error", anthropic.OverloadedError),
    (TenantLimited("this key is over its limit", reason="tenant_limit", retry_after_s=2.0),
     429, "rate_limit_error", anthropic.RateLimitError),
    (GatewayError("internal gateway error"), 500, "api_error", anthropic.InternalServerError),
])
def test_errors_take_anthropics_status_type_and_shape(error, status, kind, sdk_error):
    assert (error_status(error), error_type(error)) == (status, kind)
    expected = {"type": "error", "error": {"type": kind, "message": error.message}}
    assert orjson.loads(error_body(error)) == expected
    event = error_event(error)
    assert event == b"event: error\ndata: " + orjson.dumps(expected) + b"\n\n"
    observer = StreamObserver()
    assert observer.feed(event) == event and observer.errored and not observer.done

    # What a client sees: the SDK raises its own class for the status, with the message.
    reply = error_body(error)
    with sdk(json_handler(reply, status)) as c, pytest.raises(sdk_error) as caught:
        c.messages.create(model="claude-x", max_tokens=64, messages=HI)
    assert caught.value.status_code == status
    assert caught.value.body == expected


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (402, "billing_error"),
    (403, "permission_error"), (404, "not_found_error"), (413, "request_too_large"),
    (422, "invalid_request_error"), (429, "rate_limit_error"), (500, "api_error"),
    (502, "api_error"), (503, "overloaded_error"), (504, "timeout_error"),
    (529, "overloaded_error"),
])
def test_error_type_of_a_status_is_anthropics(status, kind):
    assert error_type_of(status) == kind


def test_an_error_message_that_does_not_name_its_param_gets_it():
    error = InvalidRequest("must be a number", param="top_p", code="invalid_value")
    assert orjson.loads(error_body(error))["error"]["message"] == \
        "must be a number (parameter: top_p)"


def test_the_sdk_raises_on_an_error_event_mid_stream():
    events = message_events(TEXT_ANSWERS[0])
    cut = events.index(b"event: content_block_stop")
    stream = events[:cut] + error_event(shed())
    with sdk(sse_handler(stream)) as c, pytest.raises(anthropic.APIStatusError) as caught, \
            c.messages.stream(model="claude-x", max_tokens=64, messages=HI) as s:
        s.get_final_message()
    assert caught.value.body == {"type": "error", "error": {
        "type": "overloaded_error", "message": "the gateway is shedding load"}}


# --- answers ---------------------------------------------------------------------------------

UNICODE = "café €5 😀 " * 20  # 200 characters: four text deltas of at most 64
TOOL_CALLS = [{"id": "toolu_01A", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
              {"id": "toolu_01B", "type": "function",
               "function": {"name": "get_time", "arguments": '{"tz":"Europe/Paris","n":[1,2]}'}}]
TEXT_ANSWERS = [
    Answer("Hello!", "stop", "claude-x", None, 12, 3),
    Answer(UNICODE, "stop", "claude-x", None, 40, 200),
    Answer("", "stop", "claude-x", None, 5, 1),
]
ANSWERS = [*TEXT_ANSWERS, Answer(None, "tool_calls", "claude-x", TOOL_CALLS, 30, 9),
           Answer("Let me look.", "tool_calls", "claude-x", TOOL_CALLS[:1], 7, 2)]


def sdk(handler: Callable[[httpx2.Request], httpx2.Response]) -> anthropic.Anthropic:
    """The official client, answered by ``handler`` instead of a network."""
    return anthropic.Anthropic(api_key="test-key", base_url="http://gateway.test",
                               max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def json_handler(content: bytes, status: int = 200
                 ) -> Callable[[httpx2.Request], httpx2.Response]:
    return lambda _: httpx2.Response(status, content=content,
                                     headers={"content-type": "application/json"})


def sse_handler(content: bytes) -> Callable[[httpx2.Request], httpx2.Response]:
    return lambda _: httpx2.Response(200, content=content,
                                     headers={"content-type": "text/event-stream"})


def sdk_message(content: bytes) -> Message:
    with sdk(json_handler(content)) as c:
        return c.messages.create(model="claude-x", max_tokens=64, messages=HI)


def sdk_streamed(content: bytes) -> Message:
    with sdk(sse_handler(content)) as c, \
            c.messages.stream(model="claude-x", max_tokens=64, messages=HI) as stream:
        return stream.get_final_message()


@pytest.mark.parametrize("answer", ANSWERS)
def test_message_body_round_trips_and_reads_with_the_sdk(answer):
    raw_body = message_body(answer, "msg_test")
    assert answer_from_message(parsed(raw_body), allow_tools=True) == answer
    message = sdk_message(raw_body)
    assert (message.id, message.model, message.role) == ("msg_test", "claude-x", "assistant")
    assert message.stop_reason == ("tool_use" if answer.tool_calls else "end_turn")
    text = [b.text for b in message.content if b.type == "text"]
    assert text == ([answer.content] if answer.content else [])
    tools = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert tools == [(c["id"], c["function"]["name"], orjson.loads(c["function"]["arguments"]))
                     for c in answer.tool_calls or ()]
    # A hit's prompt counts as read from the cache, as the OpenAI rendering counts it cached.
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens,
            message.usage.cache_creation_input_tokens, message.usage.output_tokens) == (
        0, answer.prompt_tokens, 0, answer.completion_tokens)


@pytest.mark.parametrize("answer", ANSWERS)
def test_message_events_accumulate_in_the_sdk_into_the_body(answer):
    events = message_events(answer, "msg_test")
    streamed = sdk_streamed(events)
    assert streamed.model_dump() == sdk_message(message_body(answer, "msg_test")).model_dump()


@pytest.mark.parametrize("answer", ANSWERS)
def test_message_events_are_the_sequence_anthropic_sends(answer):
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    reader = EventReader()
    parsed = [(name, adapter.validate_json(data))
              for name, data in reader.feed(message_events(answer)) + reader.flush()]
    assert all(name == event.type for name, event in parsed)
    names = [name for name, _ in parsed]
    blocks = (1 if answer.content else 0) + len(answer.tool_calls or ())
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == blocks
    start = parsed[0][1].message
    assert start.content == [] and start.stop_reason is None
    deltas = [e.delta for _, e in parsed if e.type == "content_block_delta"]
    text = [d.text for d in deltas if d.type == "text_delta"]
    assert "".join(text) == (answer.content or "") and all(len(t) <= 64 for t in text)
    if answer.content == UNICODE:
        assert len(text) == 4 and len(text[0]) == 64
    assert parsed[-2][1].usage.output_tokens == answer.completion_tokens


def ev(name: str, data: str) -> bytes:
    """One named event, as Anthropic writes them."""
    return f"event: {name}\ndata: {data}\n\n".encode()


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


@pytest.mark.parametrize("answer", TEXT_ANSWERS)
def test_event_stream_round_trips_through_observer_and_collector(answer):
    events = message_events(answer, "msg_test")
    observer, collector, out = replay(events)
    assert out == events and observer.done and not observer.errored
    assert observer.finish_reason == "stop"
    assert observer.usage is not None
    assert collector.answer(observer.finish_reason, usage_to_openai(observer.usage)) == answer
    assert collector.answer("length", usage_to_openai(observer.usage)) is None


@pytest.mark.parametrize("answer", ANSWERS[3:])
def test_streamed_tool_calls_are_not_reassembled(answer):
    observer, collector, _ = replay(message_events(answer))
    assert observer.finish_reason == "tool_calls"
    assert collector.answer("stop", None) is None


def test_a_stream_cut_by_an_error_is_not_kept():
    events = message_events(TEXT_ANSWERS[1])
    cut = events.index(b"event: content_block_stop")
    observer, collector, _ = replay(events[:cut] + error_event(shed()))
    assert observer.errored and not observer.done
    assert collector.answer("stop", None) is None


START = ev("message_start", '{"type":"message_start","message":{"id":"msg_1","type":"message",'
          '"role":"assistant","model":"claude-x","content":[],"stop_reason":null,'
          '"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}}')
TEXT = ev("content_block_start",
          '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}')


@pytest.mark.parametrize("events", [
    START + ev("content_block_start", '{"type":"content_block_start","index":0,'
               '"content_block":{"type":"thinking","thinking":"","signature":""}}'),
    START + TEXT + ev("content_block_delta", '{"type":"content_block_delta","index":0,'
                      '"delta":{"type":"citations_delta","citation":{}}}'),
    START + TEXT + ev("content_block_delta", '{"type":"content_block_delta","index":0,'),
    TEXT + ev("content_block_delta", '{"type":"content_block_delta","index":0,'
              '"delta":{"type":"text_delta","text":"no message_start"}}'),
    START + error_event(GatewayError("boom")),
])
def test_streams_that_are_not_kept(events):
    collector = AnswerCollector()
    collector.feed(events)
    assert collector.answer("stop", None) is None


def collected(events: bytes) -> Answer | None:
    collector = AnswerCollector()
    collector.feed(events)
    return collector.answer("stop", None)


@pytest.mark.parametrize("answer", ANSWERS)
def test_the_collector_reads_events_framed_otherwise_alike(answer):
    """Anthropic's framing (cut by one regex) and the same events with an ``id:`` line
    each or blank lines between them (read event by event) give the same answer; a broken
    event spoils all three."""
    events = message_events(answer, "msg_test")
    with_ids = events.replace(b"\ndata: ", b"\nid: 7\ndata: ")
    spaced = events.replace(b"\n\n", b"\n\n\n\n")
    assert collected(with_ids) == collected(spaced) == collected(events)
    assert (collected(events) is None) == (answer.finish_reason != "stop")
    broken = events.replace(b'{"type":"message_start"', b'{"type":message_start"', 1)
    assert broken != events
    assert collected(broken) is collected(broken.replace(b"\n\n", b"\n\n\n\n")) is None


def message(**changes: Any) -> dict[str, Any]:
    return {**orjson.loads(message_body(Answer("hi", "stop", "claude-x", None, 1, 1))),
            **changes}


THINKING = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
TOOL_USE = {"type": "tool_use", "id": "toolu_01A", "name": "get_weather",
            "input": {"city": "Paris"}}


@pytest.mark.parametrize(("raw_body", "allow_tools", "expected"), [
    (orjson.dumps(message(content=[{"type": "text", "text": "Hel"},
                                   {"type": "text", "text": "lo"}], stop_reason="stop_sequence",
                          stop_sequence="END", usage={"input_tokens": 3, "output_tokens": 2,
                                                      "cache_creation_input_tokens": 10,
                                                      "cache_read_input_tokens": 100})),
     False, Answer("Hello", "stop", "claude-x", None, 113, 2)),
    (orjson.dumps(message(content=[], usage={"input_tokens": 3, "output_tokens": 1})),
     False, Answer("", "stop", "claude-x", None, 3, 1)),
    (orjson.dumps(message(content=[TOOL_USE], stop_reason="tool_use")), True,
     Answer(None, "tool_calls", "claude-x", TOOL_CALLS[:1], 1, 1)),
    (orjson.dumps(message(content=[{"type": "text", "text": "Let me look."}, TOOL_USE],
                          stop_reason="tool_use")), True,
     Answer("Let me look.", "tool_calls", "claude-x", TOOL_CALLS[:1], 1, 1)),
    (orjson.dumps(message(content=[TOOL_USE], stop_reason="tool_use")), False, None),
    (orjson.dumps(message(stop_reason="max_tokens")), False, None),
    (orjson.dumps(message(stop_reason="refusal")), False, None),
    (orjson.dumps(message(stop_reason="pause_turn")), False, None),
    (orjson.dumps(message(stop_reason=None)), False, None),
    (orjson.dumps(message(content=[THINKING, {"type": "text", "text": "hi"}])), True, None),
    (orjson.dumps(message(content=[{"type": "redacted_thinking", "data": "x"}])), True, None),
    (orjson.dumps(message(content=[{"type": "server_tool_use", "id": "srvtoolu_1",
                                    "name": "web_search", "input": {}}])), True, None),
    (orjson.dumps(message(content=[{"type": "text", "text": "hi", "citations": [
        {"type": "char_location", "cited_text": "x", "document_index": 0,
         "document_title": None, "start_char_index": 0, "end_char_index": 1}]}])), True, None),
    (orjson.dumps(message(content="hi")), True, None),
    (orjson.dumps(message(type="completion")), True, None),
    (orjson.dumps({"type": "error", "error": {"type": "overloaded_error",
                                              "message": "Overloaded"}}), True, None),
    (b'{"type": "message", "content": [', True, None),
    (b"[]", True, None),
])
def test_answers_from_messages(raw_body, allow_tools, expected):
    assert answer_from_message(parsed(raw_body), allow_tools) == expected


def test_tool_call_arguments_that_are_no_object_cannot_be_rendered():
    bad = Answer(None, "tool_calls", "m", [{"id": "call_1", "type": "function",
                                             "function": {"name": "f", "arguments": "[1]"}}])
    with pytest.raises(ValueError):
        message_body(bad)
    with pytest.raises(ValueError):
        message_events(bad)


# --- the stream observer, on a recorded stream -----------------------------------------------


# As api.anthropic.com sends it (ids shortened): usage with cache reads and writes at the
# start, a ping (the one event Anthropic writes with spaces), a text block, a tool_use block
# whose JSON arrives in pieces, cumulative usage in message_delta.
RECORDED = b"".join([
    ev("message_start", '{"type":"message_start","message":{"model":"claude-sonnet-4-5",'
       '"id":"msg_01QC4g","type":"message","role":"assistant","content":[],"stop_reason":null,'
       '"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":2048,'
       '"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":2048,'
       '"ephemeral_1h_input_tokens":0},"output_tokens":1,"service_tier":"standard"}}}'),
    ev("content_block_start",
       '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'),
    ev("ping", '{"type": "ping"}'),
    ev("content_block_delta", '{"type":"content_block_delta","index":0,'
       '"delta":{"type":"text_delta","text":"Let me check the message_stop error"}}'),
    ev("content_block_delta", '{"type":"content_block_delta","index":0,'
       '"delta":{"type":"text_delta","text":" caf\\u00e9 \\"weather\\"."}}'),
    ev("content_block_stop", '{"type":"content_block_stop","index":0}'),
    ev("content_block_start", '{"type":"content_block_start","index":1,"content_block":'
       '{"type":"tool_use","id":"toolu_01T1","name":"get_weather","input":{}}}'),
    ev("content_block_delta", '{"type":"content_block_delta","index":1,'
       '"delta":{"type":"input_json_delta","partial_json":""}}'),
    ev("content_block_delta", '{"type":"content_block_delta","index":1,'
       '"delta":{"type":"input_json_delta","partial_json":"{\\"city\\": \\"Par"}}'),
    ev("content_block_delta", '{"type":"content_block_delta","index":1,'
       '"delta":{"type":"input_json_delta","partial_json":"is\\"}"}}'),
    ev("content_block_stop", '{"type":"content_block_stop","index":1}'),
    ev("message_delta", '{"type":"message_delta","delta":{"stop_reason":"tool_use",'
       '"stop_sequence":null},"usage":{"input_tokens":12,"cache_creation_input_tokens":2048,'
       '"cache_read_input_tokens":null,"output_tokens":89}}'),
    ev("message_stop", '{"type":"message_stop"}'),
])
RECORDED_USAGE = {"input_tokens": 12, "cache_creation_input_tokens": 2048,
                  "cache_read_input_tokens": 0, "cache_creation": {
                      "ephemeral_5m_input_tokens": 2048, "ephemeral_1h_input_tokens": 0},
                  "output_tokens": 89, "service_tier": "standard"}


@pytest.mark.parametrize("step", [1, 2, 7, 64, len(RECORDED)])
def test_observer_forwards_a_recorded_stream_unchanged_and_notes_its_end(step):
    observer = StreamObserver(hide_usage_chunk=True)  # accepted, and nothing is hidden
    out = b""
    for i in range(0, len(RECORDED), step):
        forwarded = observer.feed(RECORDED[i:i + step])
        assert forwarded == b"" or forwarded.endswith(b"\n\n")  # whole events only
        out += forwarded
    out += observer.flush()
    assert out == RECORDED
    assert observer.done and not observer.errored
    assert observer.finish_reason == "tool_calls"
    assert observer.usage == RECORDED_USAGE
    # The SDK reads the same bytes into the same message.
    final = sdk_streamed(out)
    assert final.usage.output_tokens == 89 and final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]


def test_observer_state_before_and_between_events():
    observer = StreamObserver()
    assert (observer.done, observer.errored, observer.finish_reason, observer.usage) == (
        False, False, None, None)
    start = RECORDED.index(b"event: message_delta")
    assert observer.feed(RECORDED[:start]) == RECORDED[:start]
    assert observer.finish_reason is None and not observer.done
    assert observer.usage is not None and observer.usage["output_tokens"] == 1


def test_observer_understands_crlf_framing():
    observer = StreamObserver()
    crlf = RECORDED.replace(b"\n", b"\r\n")
    out = b"".join(observer.feed(crlf[i:i + 5]) for i in range(0, len(crlf), 5))
    assert out + observer.flush() == RECORDED
    assert observer.done and observer.usage == RECORDED_USAGE


def test_observer_flushes_an_unterminated_last_event_with_its_terminator():
    observer = StreamObserver()
    last = b'event: message_stop\ndata: {"type":"message_stop"}'
    assert observer.feed(last + b"\n") == b""
    assert observer.flush() == last + b"\n\n" and observer.done
    assert StreamObserver().flush() == b""


def test_unnamed_events_are_read_by_their_data_type():
    observer = StreamObserver()
    observer.feed(b'data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},'
                  b'"usage":{"output_tokens":7}}\n\ndata: {"type":"message_stop"}\n\n')
    assert observer.finish_reason == "length" and observer.usage == {"output_tokens": 7}
    assert observer.done


def test_a_recorded_text_stream_is_collected_into_its_answer():
    tool_block = RECORDED.index(b"event: content_block_start", RECORDED.index(b"index"))
    text_only = RECORDED[:tool_block] + RECORDED[
        RECORDED.index(b"event: message_delta"):].replace(b'"tool_use"', b'"end_turn"')
    observer, collector, out = replay(text_only, step=3)
    assert out == text_only and observer.finish_reason == "stop"
    assert observer.usage is not None
    answer = collector.answer(observer.finish_reason, usage_to_openai(observer.usage))
    assert answer == Answer('Let me check the message_stop error café "weather".', "stop",
                            "claude-sonnet-4-5", None, 12 + 2048, 89)


def test_named_events_are_found_at_a_line_start_only_and_read_whole():
    observer = StreamObserver()
    observer.feed(
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"event: message_stop\\nevent: error"}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta",\n'
        b'data: "delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":2}}\n\n')
    assert not observer.done and not observer.errored  # the words were text, not events
    assert observer.finish_reason == "tool_calls" and observer.usage == {"output_tokens": 2}
    observer.feed(b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
                  b'"message":"Overloaded"}}\n\n')
    assert observer.errored and observer.error_type == "overloaded_error"
