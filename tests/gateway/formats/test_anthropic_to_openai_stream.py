"""An Anthropic client calling an OpenAI-compatible upstream, streamed: recorded chunk
streams in, the Messages events out, read back by the anthropic SDK's own stream class and
accumulator, as a client would."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from anthropic.types import Message

from gateway.formats.anthropic_to_openai import AnthropicStreamFromOpenAI, anthropic_response
from tests.gateway.formats.translation import anthropic_final, run


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
    whole = Message.model_validate(anthropic_response(completion))
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


@pytest.mark.parametrize("stream", [O_TEXT, O_PARALLEL, O_ERROR],
                         ids=["text", "parallel-tools", "error"])
def test_output_does_not_depend_on_chunking_or_line_ends(stream):
    whole = run(AnthropicStreamFromOpenAI(), stream)
    crlf = stream.replace(b"\n", b"\r\n")
    for body, step in [(stream, 1), (stream, 7), (crlf, 1), (crlf, 5), (crlf, None)]:
        assert run(AnthropicStreamFromOpenAI(), body, step) == whole


def test_an_unterminated_last_event_is_translated_by_flush():
    t = AnthropicStreamFromOpenAI()
    assert not t.done
    t.feed(O_TEXT[:-2])
    assert not t.done and t.flush() and t.done
