"""An OpenAI client calling an Anthropic upstream, streamed: recorded Anthropic event streams
in, the chunk stream out, read back by the openai SDK's own stream class and accumulator,
as a client would, and by the gateway's own stream observer."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from gateway.formats.openai_stream import StreamObserver
from gateway.formats.openai_to_anthropic import OpenAIStreamFromAnthropic
from tests.gateway.formats.translation import openai_final, run


def a(name: str, obj: dict[str, Any]) -> bytes:
    """One Anthropic event, spaced as Anthropic serialises it."""
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()


def start(usage: dict[str, int]) -> bytes:
    return a("message_start", {"type": "message_start", "message": {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
        "content": [], "model": "claude-sonnet-4-5", "stop_reason": None, "stop_sequence": None,
        "usage": usage}})


def block(i: int, content: dict[str, Any]) -> bytes:
    return a("content_block_start", {"type": "content_block_start", "index": i,
                                      "content_block": content})


def delta(i: int, d: dict[str, Any]) -> bytes:
    return a("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})


def stop(i: int) -> bytes:
    return a("content_block_stop", {"type": "content_block_stop", "index": i})


def end(reason: str, usage: dict[str, int]) -> bytes:
    return a("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": reason, "stop_sequence": None}, "usage": usage}) + \
        a("message_stop", {"type": "message_stop"})


PING = a("ping", {"type": "ping"})
A_TEXT = (start({"input_tokens": 12, "cache_creation_input_tokens": 100,
                 "cache_read_input_tokens": 2000, "output_tokens": 1})
          + block(0, {"type": "text", "text": ""}) + PING
          + delta(0, {"type": "text_delta", "text": "Hello"})
          + delta(0, {"type": "text_delta", "text": ", wörld!"}) + stop(0)
          + end("end_turn", {"output_tokens": 15}))
A_TOOLS = (start({"input_tokens": 400, "output_tokens": 2}) + PING
           + block(0, {"type": "thinking", "thinking": ""})
           + delta(0, {"type": "thinking_delta", "thinking": "Two cities."})
           + delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}) + stop(0)
           + block(1, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va"}) + stop(1)
           + block(2, {"type": "text", "text": ""})
           + delta(2, {"type": "text_delta", "text": "Checking both."}) + stop(2)
           + block(3, {"type": "tool_use", "id": "toolu_01A", "name": "get_weather",
                       "input": {}})
           + delta(3, {"type": "input_json_delta", "partial_json": ""})
           + delta(3, {"type": "input_json_delta", "partial_json": '{"city": "Pa'})
           + delta(3, {"type": "input_json_delta", "partial_json": 'ris"}'}) + stop(3)
           + block(4, {"type": "tool_use", "id": "toolu_01B", "name": "get_weather",
                       "input": {}})
           + delta(4, {"type": "input_json_delta", "partial_json": '{"city": "Oslo"}'})
           + stop(4) + end("tool_use", {"input_tokens": 400, "output_tokens": 89}))
A_ERROR = (start({"input_tokens": 5, "output_tokens": 1})
           + block(0, {"type": "text", "text": ""})
           + delta(0, {"type": "text_delta", "text": "Once"})
           + a("error", {"type": "error", "error": {"type": "overloaded_error",
                                                    "message": "Overloaded"}})
           + delta(0, {"type": "text_delta", "text": " upon"}) + stop(0)
           + end("end_turn", {"output_tokens": 2}))


@pytest.mark.parametrize("stream, content, calls, finish, use", [
    (A_TEXT, "Hello, wörld!", [], "stop",
     {"prompt_tokens": 2112, "completion_tokens": 15, "total_tokens": 2127, "cached": 2000}),
    (A_TOOLS, "Checking both.",
     [("toolu_01A", "get_weather", '{"city": "Paris"}'),
      ("toolu_01B", "get_weather", '{"city": "Oslo"}')], "tool_calls",
     {"prompt_tokens": 400, "completion_tokens": 89, "total_tokens": 489, "cached": 0}),
], ids=["text-with-cache", "thinking-text-parallel-tools"])
def test_openai_sdk_reads_the_translated_stream(stream, content, calls, finish, use):
    t = OpenAIStreamFromAnthropic()
    out = run(t, stream)
    assert t.done and not t.errored and out.endswith(b"data: [DONE]\n\n")
    final = openai_final(out)
    assert final.id == "chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL"
    assert final.model == "claude-sonnet-4-5"
    choice = final.choices[0]
    assert choice.message.content == content and choice.finish_reason == finish
    assert [(c.id, c.function.name, c.function.arguments)
            for c in choice.message.tool_calls or []] == calls
    assert final.usage is not None and final.usage.prompt_tokens_details is not None
    assert {"prompt_tokens": final.usage.prompt_tokens,
            "completion_tokens": final.usage.completion_tokens,
            "total_tokens": final.usage.total_tokens,
            "cached": final.usage.prompt_tokens_details.cached_tokens} == use


def test_chunks_have_openais_exact_shape_and_pass_the_gateways_fast_path():
    t = OpenAIStreamFromAnthropic(model="alias", created=1730000000)
    events = run(t, A_TEXT).split(b"\n\n")
    head = (b'data: {"id":"chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL",'
            b'"object":"chat.completion.chunk","created":1730000000,"model":"alias",'
            b'"choices":[{"index":0,"delta":')
    assert events[:4] == [
        head + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
        head + b'{"content":"Hello"},"logprobs":null,"finish_reason":null}]}',
        head + '{"content":", wörld!"},"logprobs":null,"finish_reason":null}]}'.encode(),
        head + b'{},"logprobs":null,"finish_reason":"stop"}]}']
    base = head.removesuffix(b'"choices":[{"index":0,"delta":')
    assert events[4].startswith(base + b'"choices":[],"usage":{"prompt_tokens":2112,')
    assert events[5:] == [b"data: [DONE]", b""]
    # The gateway's observer forwards content blocks untouched and drops the usage chunk.
    observer = StreamObserver(hide_usage_chunk=True)
    shown = observer.feed(b"\n\n".join(events))
    assert shown == b"\n\n".join(events[:4] + events[5:])
    assert observer.done and observer.finish_reason == "stop"
    assert observer.usage is not None and observer.usage["prompt_tokens"] == 2112


def test_anthropic_error_midway_becomes_an_openai_error_event_and_ends_the_output():
    t = OpenAIStreamFromAnthropic()
    out = run(t, A_ERROR)
    assert t.errored and not t.done
    assert out.endswith(b'data: {"error":{"message":"Overloaded","type":"overloaded_error",'
                        b'"param":null,"code":"overloaded_error"}}\n\n')
    assert b"upon" not in out and b"[DONE]" not in out and t.feed(PING + A_TEXT) == b""
    with pytest.raises(openai.APIError, match="Overloaded"):
        openai_final(out)


@pytest.mark.parametrize("stream, reason", [
    (A_TEXT[:A_TEXT.index(b"event: message_delta")], "no message_delta"),
    (A_TEXT[:A_TEXT.index(b"event: message_stop")], "no message_stop"),
    (A_TEXT[:-12], "cut inside message_stop"),
])
def test_anthropic_stream_cut_short_gets_no_terminator(stream, reason):
    t = OpenAIStreamFromAnthropic()
    out = run(t, stream)
    assert not t.done and b"[DONE]" not in out and b'"choices":[]' not in out, reason


@pytest.mark.parametrize("stream", [delta(0, {"type": "text_delta", "text": "x"}),
                                    b"event: message_start\ndata: {not json\n\n"])
def test_an_invalid_anthropic_stream_is_an_error(stream):
    t = OpenAIStreamFromAnthropic()
    out = run(t, stream)
    assert t.errored and b'"type":"upstream_error"' in out and out.count(b"\n\n") == 1


@pytest.mark.parametrize("stream", [A_TEXT, A_TOOLS, A_ERROR], ids=["text", "tools", "error"])
def test_output_does_not_depend_on_chunking_or_line_ends(stream):
    whole = run(OpenAIStreamFromAnthropic(created=1), stream)
    crlf = stream.replace(b"\n", b"\r\n")
    for body, step in [(stream, 1), (stream, 7), (crlf, 1), (crlf, 5), (crlf, None)]:
        assert run(OpenAIStreamFromAnthropic(created=1), body, step) == whole


def test_an_unterminated_last_event_is_translated_by_flush():
    t = OpenAIStreamFromAnthropic()
    assert not t.done
    t.feed(A_TEXT[:-2])
    assert not t.done and t.flush() and t.done
