"""The stream watch's reading of upstream events (gateway.stream_events): what is the answer
beginning, what is only bookkeeping or a keep-alive, in each upstream API."""

from __future__ import annotations

import pytest

from gateway.stream_events import (
    CONTENT,
    END,
    MARKS,
    OPENING,
    PING,
    alive,
    kind_of,
    retryable_error,
)


@pytest.mark.parametrize(("data", "kind"), [
    (b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', OPENING),
    ((b'{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
      b'"logprobs":null,"finish_reason":null}]}'), OPENING),  # told without parsing
    (b'{"choices":[{"index":0,"delta":{"content":"","refusal":"No."}}]}', CONTENT),
    (b'{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}', END),
    (b'{"choices":[{"index":0,"delta":{"content":"","reasoning_content":"hm"}}]}', CONTENT),
    ((b'{"choices":[{"index":0,"delta":{"content":"","tool_calls":[{"index":0,"id":"c",'
      b'"function":{"name":"f","arguments":""}}]}}]}'), CONTENT),
    (b'{"choices":[{"index":0,"delta":{"content":"Hi"}}]}', CONTENT),
    (b'{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}', CONTENT),
    (b'{"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}', CONTENT),
    ((b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":'
      b'{"name":"f","arguments":""}}]}}]}'), CONTENT),
    (b'{"choices":[{"index":0,"text":"Hi"}]}', CONTENT),  # legacy completions
    (b'{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}', END),
    (b'{"choices":[],"usage":{"prompt_tokens":1}}', OPENING),
    (b'{"error":{"message":"overloaded"}}', END),
    (b"[DONE]", END),
    (b"not json", OPENING),
])
def test_openai_chunks(data: bytes, kind: int) -> None:
    assert kind_of("openai", (None, data)) == kind


@pytest.mark.parametrize(("name", "kind"), [
    ("message_start", OPENING), ("content_block_start", OPENING), ("ping", PING),
    ("content_block_delta", CONTENT), ("message_delta", END), ("message_stop", END),
    ("error", END),
])
def test_anthropic_events(name: str, kind: int) -> None:
    assert kind_of("anthropic", (name, b'{"type": "%s"}' % name.encode())) == kind
    assert kind_of("anthropic", (None, b'{"type": "%s"}' % name.encode())) == kind


@pytest.mark.parametrize(("name", "kind"), [
    ("response.created", OPENING), ("response.in_progress", OPENING),
    ("response.output_item.added", OPENING), ("response.web_search_call.searching", OPENING),
    ("response.output_text.delta", CONTENT), ("response.function_call_arguments.delta", CONTENT),
    ("response.reasoning_summary_text.delta", CONTENT), ("response.completed", END),
    ("response.failed", END), ("response.incomplete", END), ("error", END),
])
def test_responses_events(name: str, kind: int) -> None:
    assert kind_of("responses", (name, b"{}")) == kind


def test_pings_and_comments_are_not_alive_anything_else_is() -> None:
    assert not alive(b'event: ping\ndata: {"type": "ping"}\n\n')
    assert not alive(b": keepalive\n\n: OPENROUTER PROCESSING\n\n")
    assert not alive(b'event: ping\r\ndata: {"type": "ping"}\r\n\r\n: x\r\n\r\n')
    assert alive(b'data: {"choices":[]}\n\n')
    assert alive(b': keepalive\n\nevent: content_block_delta\ndata: {}\n\n')
    assert alive(b'event: ping\ndata: {"type": "ping"}\n\nevent: message_stop\ndata: {}\n\n')


def test_an_error_event_is_told_retryable_or_the_requests_own_fault() -> None:
    """A server's in-band error (overloaded, api_error, server_error, an unknown type) may
    not meet another attempt; the request's own fault would: it is relayed as it is."""
    openai_error = (None, b'{"error": {"type": "server_error", "message": "overloaded"}}')
    assert retryable_error("openai", openai_error) == "server_error"
    bad = (None, b'{"error": {"type": "invalid_request_error", "message": "no"}}')
    assert retryable_error("openai", bad) is None
    overloaded = ("error", b'{"type": "error", "error": {"type": "overloaded_error"}}')
    assert retryable_error("anthropic", overloaded) == "overloaded_error"
    failed = ("response.failed", (b'{"type": "response.failed", "response": {"error": '
                                 b'{"code": "server_error", "message": "x"}}}'))
    assert retryable_error("responses", failed) == "server_error"
    assert retryable_error("responses", ("error", (b'{"type": "error", "code": '
                                                  b'"context_length_exceeded"}'))) is None
    finish = (None, b'{"choices": [{"delta": {}, "finish_reason": "stop"}]}')
    assert retryable_error("openai", finish) is None
    assert retryable_error("openai", (None, b"[DONE]")) is None


@pytest.mark.parametrize(("api", "name", "kind"), [
    ("anthropic", "content_block_delta", CONTENT), ("anthropic", "message_delta", END),
    ("anthropic", "message_stop", END), ("anthropic", "error", END),
    ("responses", "response.output_text.delta", CONTENT),
    ("responses", "response.function_call_arguments.delta", CONTENT),
    ("responses", "response.completed", END), ("responses", "response.failed", END),
    ("responses", "response.incomplete", END), ("responses", "error", END)])
def test_every_answer_or_end_holds_its_apis_mark(api: str, name: str, kind: int) -> None:
    """A block of whole events without the mark is left unparsed before the first token:
    it must then hold no answer and no end (named in the event line or only in its data)."""
    mark = MARKS[api]
    assert mark is not None
    assert kind_of(api, (None, b'{"type":"%s"}' % name.encode())) == kind
    for raw in (b"event: %s\ndata: {}\n\n" % name.encode(),
                b'data: {"type":"%s"}\n\n' % name.encode()):
        assert mark.search(raw) is not None
