"""Chat chunks as Responses events: every event is one the openai SDK parses, in the order
its stream helper (``client.responses.stream``) accumulates into the final response; and a
Responses stream observed, collected, and rendered from a cached answer."""

from __future__ import annotations

from typing import Any

import orjson
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.formats.answer import Answer
from gateway.formats.responses_stream import AnswerCollector, StreamObserver, response_events
from gateway.formats.responses_to_openai.stream import ResponsesStreamFromChat
from llm_wire.sse import EventReader

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
          usage: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                           "created": 1, "model": "smollm2",
                           "choices": [] if delta is None else [
                               {"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        out["usage"] = usage
    return out


def sse(chunks: list[dict[str, Any]], done: bool = True) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n" if done else b"")


def translate(raw: bytes, pieces: int = 7) -> tuple[ResponsesStreamFromChat, list[Any]]:
    """Fed in uneven pieces, as a network delivers it; the events parsed by the SDK."""
    t = ResponsesStreamFromChat({"model": "m", "input": "hi", "instructions": "S"})
    out = b""
    for i in range(0, len(raw), pieces):
        out += t.feed(raw[i:i + pieces])
    out += t.flush()
    reader = EventReader()
    events = reader.feed(out) + reader.flush()
    parsed = []
    for name, data in events:
        event = EVENTS.validate_python(orjson.loads(data))
        assert event.type == name
        parsed.append(event)
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    return t, parsed


def final(events: list[Any]) -> Any:
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    out: list[Any] = []
    for event in events:
        out += state.handle_event(event)
    return out[-1]


def test_text_streams_as_typed_events_the_sdk_accumulates() -> None:
    t, events = translate(sse([
        chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
        chunk({"content": "lo!"}), chunk({}, "stop"),
        chunk(usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11})]))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert t.done and not t.errored
    done = final(events)
    assert done.type == "response.completed"
    assert done.response.output_text == "Hello!" and done.response.instructions == "S"
    assert (done.response.usage.input_tokens, done.response.usage.output_tokens) == (9, 2)


def test_tool_calls_stream_as_function_call_items() -> None:
    _, events = translate(sse([
        chunk({"role": "assistant", "content": "Let me look."}),
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "time", "arguments": "{}"}}]}),
        chunk({}, "tool_calls")]))
    response = final(events).response
    assert [item.type for item in response.output] == ["message", "function_call",
                                                       "function_call"]
    call = response.output[1]
    assert (call.call_id, call.name, call.arguments) == ("call_a", "weather",
                                                         "{\"city\":\"Paris\"}")
    assert response.output[2].arguments == "{}"
    assert "response.function_call_arguments.done" in [e.type for e in events]


def test_a_stopped_at_the_limit_answer_ends_incomplete() -> None:
    _, events = translate(sse([chunk({"content": "Hel"}), chunk({}, "length")]))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_an_upstream_error_ends_the_stream_with_an_error_event() -> None:
    t, events = translate(sse([chunk({"content": "Hel"})], done=False)
                          + b'data: {"error": {"message": "overloaded", "type": '
                            b'"server_error", "code": "overloaded"}}\n\n'
                          + sse([chunk({"content": "more"})]))
    assert t.errored and not t.done
    assert events[-1].type == "error" and events[-1].message == "overloaded"
    assert [e.type for e in events].count("response.output_text.delta") == 1


def test_a_stream_cut_short_gets_no_completion() -> None:
    t, events = translate(sse([chunk({"content": "Hel"}), chunk({}, "stop")], done=False))
    assert not t.done and not t.errored
    assert events[-1].type == "response.output_text.delta"


# -- observing, collecting and rendering a Responses stream ---------------------------------

def translated(chunks: list[dict[str, Any]], done: bool = True) -> bytes:
    t = ResponsesStreamFromChat({"model": "m", "input": "hi"})
    return t.feed(sse(chunks, done)) + t.flush()


def observe(raw: bytes, pieces: int = 11) -> tuple[StreamObserver, bytes]:
    o = StreamObserver()
    out = b"".join(o.feed(raw[i:i + pieces]) for i in range(0, len(raw), pieces)) + o.flush()
    return o, out


def test_the_observer_forwards_the_bytes_and_notes_the_end() -> None:
    raw = translated([chunk({"content": "Hi"}), chunk({}, "stop"),
                      chunk(usage={"prompt_tokens": 4, "completion_tokens": 1,
                                   "total_tokens": 5})])
    o, out = observe(raw)
    assert out == raw
    assert (o.done, o.errored, o.finish_reason) == (True, False, "stop")
    assert o.usage is not None and (o.usage["prompt_tokens"], o.usage["completion_tokens"]) \
        == (4, 1)
    calls = observe(translated([chunk({"tool_calls": [
        {"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]}),
        chunk({}, "tool_calls")]))[0]
    assert calls.finish_reason == "tool_calls"
    assert observe(translated([chunk({"content": "H"}), chunk({}, "length")]))[0] \
        .finish_reason == "length"


def test_the_observer_notes_an_error_and_a_stream_cut_short() -> None:
    raw = translated([chunk({"content": "H"})], done=False) + \
        b'data: {"error": {"message": "boom", "code": "server_error"}}\n\n'
    o, _ = observe(translated([chunk({"content": "H"})], done=False))
    assert not o.done and not o.errored
    t = ResponsesStreamFromChat()
    o, _ = observe(t.feed(raw) + t.flush())
    assert o.errored and o.error_type == "server_error" and not o.done


def test_a_streamed_answer_is_collected_and_a_hit_streams_like_a_translated_answer() -> None:
    collector = AnswerCollector()
    collector.feed(translated([chunk({"content": "Par"}), chunk({"content": "is."}),
                               chunk({}, "stop"), chunk(usage={
                                   "prompt_tokens": 4, "completion_tokens": 2,
                                   "total_tokens": 6})]))
    answer = collector.answer("stop", None)
    assert answer == Answer("Paris.", "stop", "smollm2", None, 4, 2)
    reader = EventReader()
    raw = response_events(answer, {"model": "m", "input": "hi"}, "chatcmpl-cache-1")
    events = [EVENTS.validate_python(orjson.loads(d)) for _, d in reader.feed(raw)]
    done = final(events)
    assert done.type == "response.completed" and done.response.output_text == "Paris."
    assert done.response.usage.output_tokens == 2
    unfinished = AnswerCollector()
    unfinished.feed(translated([chunk({"content": "Par"})], done=False))
    assert unfinished.answer("stop", None) is None


def test_each_event_is_the_json_of_its_fields_whole_chunks_or_cut() -> None:
    """The text deltas' bytes are made directly: they are still exactly ``json_event`` of
    their fields (quotes, newlines, any Unicode), fed as whole chunks or cut anywhere."""
    from llm_wire.sse import json_event

    raw = sse([chunk({"role": "assistant", "content": ""}),
               chunk({"content": 'a "quote"\n'}), chunk({"content": "é \u2028 \\ 🙂"}),
               chunk({}, "stop")])
    whole = ResponsesStreamFromChat()
    out = b"".join(whole.feed(b"data: " + part) for part in raw.split(b"data: ")[1:])
    for name, data in EventReader().feed(out):
        assert name is not None
        assert json_event(orjson.loads(data), name) in out
    _, parsed = translate(raw, pieces=3)
    deltas = [e.delta for e in parsed if e.type == "response.output_text.delta"]
    assert deltas == ['a "quote"\n', "é \u2028 \\ 🙂"]


def test_the_prompt_cache_reads_reach_the_streamed_usage() -> None:
    raw = sse([chunk({"role": "assistant", "content": "hi"}), chunk({}, "stop"),
               chunk(None, usage={"prompt_tokens": 40, "completion_tokens": 1,
                                  "total_tokens": 41,
                                  "prompt_tokens_details": {"cached_tokens": 32}})])
    _, parsed = translate(raw)
    usage = parsed[-1].response.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (40, 32)


def test_the_end_is_found_in_a_block_of_many_events_and_only_there() -> None:
    """A whole stream in one block (CRLF or LF), a text that names the end event, and an end
    event with its ``event:`` line: only the real end counts, once."""
    from gateway.formats.responses_stream import final_response

    raw = translated([chunk({"content": 'say "type":"response.completed" please'}),
                      chunk({}, "stop")])
    for block in (raw, raw.replace(b"\n", b"\r\n")):
        o, _ = observe(block)
        assert (o.done, o.finish_reason) == (True, "stop")
        response = final_response(block)
        assert response is not None and response["status"] == "completed"
        assert response["output"][0]["content"][0]["text"].startswith("say ")
    assert final_response(translated([chunk({"content": "response.completed"})],
                                     done=False)) is None


def test_a_block_of_data_lines_reads_as_each_event_does_alone() -> None:
    """One-line data events (the common OpenAI event) and every other shape in the same
    block: the reader gives what reading each event alone gives."""
    from llm_wire.sse import parse_event

    events = [b'data: {"a":1}', b"data: ", b": keep-alive", b"event: ping\ndata: {}",
              b"data: x\ndata: y", b"data:{}", b"id: 7\ndata: [DONE]"]
    alone = [parse_event(e) for e in events]
    expected = [e for e in alone if e[0] is not None or e[1]]
    assert EventReader().feed(b"\n\n".join(events) + b"\n\n") == expected
