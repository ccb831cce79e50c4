"""Stream translators, OpenAI <-> Anthropic: recorded upstream streams in, and the output read
back by the official SDKs' own stream classes and accumulators, as a client would."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic.lib.streaming import MessageStream
from anthropic.types import Message, RawMessageStreamEvent
from openai.lib.streaming.chat import ChatCompletionStream
from openai.types.chat import ChatCompletionChunk, ParsedChatCompletion

from gateway.formats.anthropic_openai_answers import anthropic_response
from gateway.formats.anthropic_openai_stream import (
    AnthropicStreamFromOpenAI,
    OpenAIStreamFromAnthropic,
)
from gateway.formats.openai_stream import StreamObserver


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


def o(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chunk(d: dict[str, Any], finish: str | None = None) -> bytes:
    return o({"id": "chatcmpl-9f2c4e", "object": "chat.completion.chunk", "created": 1730000000,
              "model": "llama-3.1-8b", "choices": [
                  {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]})


def call(i: int, id_: str | None = None, name: str | None = None, args: str = "") -> bytes:
    c: dict[str, Any] = {"index": i, "function": {"arguments": args}}
    if id_:
        c.update(id=id_, type="function")
        c["function"]["name"] = name
    return chunk({"tool_calls": [c]})


def usage(prompt: int, completion: int, cached: int = 0) -> bytes:
    return o({"id": "chatcmpl-9f2c4e", "object": "chat.completion.chunk", "created": 1730000000,
              "model": "llama-3.1-8b", "choices": [], "usage": {
                  "prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}}})


ROLE = chunk({"role": "assistant", "content": ""})
DONE = b"data: [DONE]\n\n"
O_TEXT = (ROLE + chunk({"content": "Hel"}) + chunk({"content": ""}) + chunk({"content": "lo"})
          + chunk({}, "stop") + usage(2100, 7, cached=2000) + DONE)
O_PARALLEL = (ROLE + call(0, "call_a", "get_weather") + call(0, args='{"city":')
              + call(0, args='"Paris"}') + call(1, "call_b", "get_time", '{"tz":"CET"}')
              + chunk({}, "tool_calls") + usage(50, 30) + DONE)
O_TEXT_TOOL = (ROLE + chunk({"content": "Let me look."}) + call(0, "call_c", "search")
               + call(0, args='{"q":"sse"}') + chunk({}, "tool_calls") + usage(9, 4) + DONE)
# Ids as some servers (Kimi, some vLLM parsers) write them; Anthropic accepts [a-zA-Z0-9_-].
O_ODD_IDS = (ROLE + call(0, "functions.get_weather:0", "get_weather", '{"city":"Paris"}')
             + call(1, "call b/1", "get_time", '{"tz":"CET"}') + chunk({}, "tool_calls")
             + usage(50, 30) + DONE)


def cut_by(error: bytes) -> bytes:
    return ROLE + chunk({"content": "Once"}) + error + chunk({"content": " upon"}) + DONE


O_ERROR = cut_by(o({"error": {"message": "The server had an error", "type": "server_error",
                              "param": None, "code": None}}))
VLLM_ERROR = cut_by(o({"object": "error", "message": "The server had an error",
                       "type": "BadRequestError", "param": None, "code": 400}))


def run(translator: OpenAIStreamFromAnthropic | AnthropicStreamFromOpenAI, stream: bytes,
        step: int | None = None) -> bytes:
    step = step or len(stream)
    out = b"".join(translator.feed(stream[i:i + step]) for i in range(0, len(stream), step))
    return out + translator.flush()


def response(body: bytes) -> httpx2.Response:
    return httpx2.Response(200, content=body, request=httpx2.Request("POST", "http://up/v1"))


def openai_final(body: bytes) -> ParsedChatCompletion[None]:
    with openai.OpenAI(api_key="k") as client:
        raw = openai.Stream(cast_to=ChatCompletionChunk, response=response(body), client=client)
        return ChatCompletionStream(raw_stream=raw, response_format=openai.omit,
                                    input_tools=openai.omit).get_final_completion()


def anthropic_final(body: bytes) -> Message:
    with anthropic.Anthropic(api_key="k") as client:
        raw = anthropic.Stream(cast_to=RawMessageStreamEvent, response=response(body),
                               client=client)  # type: ignore[arg-type]
        return MessageStream(raw, anthropic.NOT_GIVEN).get_final_message()


# -- Anthropic upstream -> OpenAI client -----------------------------------------------------

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


# -- OpenAI upstream -> Anthropic client -----------------------------------------------------

@pytest.mark.parametrize("stream, blocks, reason, use", [
    (O_TEXT, [("text", "Hello")], "end_turn", (100, 7, 2000)),
    (O_PARALLEL, [("tool_use", "call_a", "get_weather", {"city": "Paris"}),
                  ("tool_use", "call_b", "get_time", {"tz": "CET"})], "tool_use", (50, 30, 0)),
    (O_TEXT_TOOL, [("text", "Let me look."), ("tool_use", "call_c", "search", {"q": "sse"})],
     "tool_use", (9, 4, 0)),
    (O_ODD_IDS, [("tool_use", "functions_get_weather_0", "get_weather", {"city": "Paris"}),
                 ("tool_use", "call_b_1", "get_time", {"tz": "CET"})], "tool_use", (50, 30, 0)),
], ids=["text-with-cache", "parallel-tools", "text-then-tool", "ids-made-safe"])
def test_anthropic_sdk_accumulates_the_translated_stream(stream, blocks, reason, use):
    t = AnthropicStreamFromOpenAI()
    out = run(t, stream)
    assert t.done and not t.errored
    message = anthropic_final(out)
    assert message.id == "msg_9f2c4e" and message.model == "llama-3.1-8b"
    assert [(b.type, b.text) if b.type == "text" else (b.type, b.id, b.name, b.input)
            for b in message.content] == blocks
    assert message.stop_reason == reason
    assert (message.usage.input_tokens, message.usage.output_tokens,
            message.usage.cache_read_input_tokens) == use


def test_streamed_tool_use_ids_are_the_whole_answers():
    completion = {"id": "chatcmpl-9f2c4e", "object": "chat.completion", "created": 1730000000,
                  "model": "llama-3.1-8b", "choices": [{
                      "index": 0, "finish_reason": "tool_calls", "message": {
                          "role": "assistant", "content": None, "tool_calls": [
                              {"id": "functions.get_weather:0", "type": "function",
                               "function": {"name": "get_weather",
                                            "arguments": '{"city":"Paris"}'}},
                              {"id": "call b/1", "type": "function", "function": {
                                  "name": "get_time", "arguments": '{"tz":"CET"}'}}]}}]}
    whole = Message.model_validate_json(anthropic_response(json.dumps(completion).encode()))
    streamed = anthropic_final(run(AnthropicStreamFromOpenAI(), O_ODD_IDS))
    assert [b.id for b in streamed.content] == [b.id for b in whole.content] == [
        "functions_get_weather_0", "call_b_1"]


def test_anthropic_events_come_in_anthropics_order_each_named():
    out = run(AnthropicStreamFromOpenAI(model="alias"), O_TEXT_TOOL)
    events = [e.split(b"\n") for e in out.split(b"\n\n")[:-1]]
    names = [e[0].removeprefix(b"event: ").decode() for e in events]
    assert names == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    data = [json.loads(e[1].removeprefix(b"data: ")) for e in events]
    assert all(d["type"] == n for d, n in zip(data, names))
    assert data[0]["message"] == {
        "id": "msg_9f2c4e", "type": "message", "role": "assistant", "model": "alias",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0}}
    assert [d.get("index") for d in data[1:7]] == [0, 0, 0, 1, 1, 1]
    assert data[4]["content_block"] == {"type": "tool_use", "id": "call_c", "name": "search",
                                        "input": {}}
    assert data[7] == {"type": "message_delta", "delta": {
        "stop_reason": "tool_use", "stop_sequence": None}, "usage": {
        "input_tokens": 9, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
        "output_tokens": 4}}


@pytest.mark.parametrize("stream", [O_ERROR, VLLM_ERROR], ids=["openai", "vllm"])
def test_openai_error_midway_becomes_an_anthropic_error_event_and_ends_the_output(stream):
    t = AnthropicStreamFromOpenAI()
    out = run(t, stream)
    assert t.errored and not t.done
    assert out.endswith(b'event: error\ndata: {"type":"error","error":{"type":"api_error",'
                        b'"message":"The server had an error"}}\n\n')
    assert b"upon" not in out and b"message_stop" not in out
    with pytest.raises(anthropic.APIStatusError, match="The server had an error"):
        anthropic_final(out)


@pytest.mark.parametrize("stream", [
    O_TEXT[:O_TEXT.index(DONE)],  # finish_reason and usage came, [DONE] did not
    O_TEXT[:O_TEXT.index(b"data: [DONE]") + 8],  # cut inside [DONE]
    ROLE + chunk({"content": "Hel"}),
])
def test_openai_stream_cut_short_gets_no_message_stop(stream):
    t = AnthropicStreamFromOpenAI()
    out = run(t, stream)
    assert not t.done and b"message_stop" not in out and b"message_delta" not in out


def test_empty_content_chunks_emit_nothing_but_the_first_starts_the_message():
    t = AnthropicStreamFromOpenAI()
    assert t.feed(ROLE).startswith(b"event: message_start\n")
    assert t.feed(chunk({"content": ""}) + chunk({}) + b": keep-alive\n\n") == b""


# -- both ------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, stream", [
    (OpenAIStreamFromAnthropic, A_TEXT), (OpenAIStreamFromAnthropic, A_TOOLS),
    (OpenAIStreamFromAnthropic, A_ERROR), (AnthropicStreamFromOpenAI, O_TEXT),
    (AnthropicStreamFromOpenAI, O_PARALLEL), (AnthropicStreamFromOpenAI, O_ERROR),
])
def test_output_does_not_depend_on_chunking_or_line_ends(make, stream):
    whole = run(make(created=1) if make is OpenAIStreamFromAnthropic else make(), stream)
    crlf = stream.replace(b"\n", b"\r\n")
    for body, step in [(stream, 1), (stream, 7), (crlf, 1), (crlf, 5), (crlf, None)]:
        t = make(created=1) if make is OpenAIStreamFromAnthropic else make()
        assert run(t, body, step) == whole


@pytest.mark.parametrize("make, stream", [
    (OpenAIStreamFromAnthropic, A_TEXT[:-2]), (AnthropicStreamFromOpenAI, O_TEXT[:-2]),
])
def test_an_unterminated_last_event_is_translated_by_flush(make, stream):
    t = make()
    assert not t.done
    t.feed(stream)
    assert not t.done and t.flush() and t.done
