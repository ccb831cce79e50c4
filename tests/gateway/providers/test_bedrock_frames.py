"""Bedrock's framing and errors, read where they enter (pure): the test-only event-stream
encoder round-trips through botocore's parser, the decoder turns frames cut anywhere back
into the SSE the gateway reads, and Bedrock's exceptions get their status and type."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer

from gateway.errors import UpstreamError
from gateway.formats.converse_stream import AnthropicStreamFromConverse
from gateway.testing.eventstream import chunk_frame, event_frame, exception_frame, frame
from gateway.upstreams.base import UpstreamResponse
from gateway.upstreams.bedrock import model_path
from gateway.upstreams.bedrock_errors import anthropic_error, mapped
from gateway.upstreams.bedrock_stream import EventStreamResponse, converse_event, invoke_event

START = {"type": "message_start", "message": {"id": "msg_1", "content": []}}
DELTA = {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "hi\nthere"}}


def test_the_encoder_round_trips_through_botocores_parser() -> None:
    data = frame({":event-type": "chunk", ":message-type": "event"}, b'{"a":1}') \
        + exception_frame("throttlingException", "slow down")
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    first, second = list(buffer)
    assert first.headers == {":event-type": "chunk", ":message-type": "event"}
    assert first.payload == b'{"a":1}'
    assert second.headers[":exception-type"] == "throttlingException"
    assert orjson.loads(second.payload) == {"message": "slow down"}


class _Body(UpstreamResponse):
    """A response whose body arrives in the given pieces."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.status, self.headers, self._pieces = 200, [], pieces

    async def _gen(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece

    def iter_chunks(self, idle_s: float = 0.0) -> AsyncIterator[bytes]:
        return self._gen()

    def watch_idle(self, idle_s: float, on_stall: Callable[[], None]) -> None:
        pass

    async def read(self) -> bytes:
        return b"".join(self._pieces)

    def close(self) -> None:
        pass


def _decoded(data: bytes, cut: int, decode: Callable[..., bytes]) -> bytes:
    pieces = [data[:cut], data[cut:]] if cut else [data]
    return asyncio.run(EventStreamResponse(_Body(pieces), decode).read())


@pytest.mark.parametrize("cut", [0, 1, 11, 12, 40, 97])
def test_invoke_frames_cut_anywhere_become_the_anthropic_stream(cut: int) -> None:
    data = chunk_frame(START) + chunk_frame(DELTA)
    out = _decoded(data, cut, invoke_event)
    events = out.split(b"\n\n")[:-1]
    assert events[0] == b"event: message_start\ndata: " + orjson.dumps(START)
    name, line = events[1].split(b"\n")
    assert name == b"event: content_block_delta"  # one data line: the newline escaped
    assert orjson.loads(line.removeprefix(b"data: ")) == DELTA


def test_an_exception_frame_becomes_an_anthropic_error_event() -> None:
    out = _decoded(exception_frame("modelStreamErrorException", "broke"), 0, invoke_event)
    name, line = out.strip().split(b"\n")
    assert name == b"event: error"
    assert orjson.loads(line.removeprefix(b"data: ")) == {
        "type": "error", "error": {"type": "api_error", "message": "broke"}}


def test_a_frame_with_a_bad_checksum_breaks_the_stream() -> None:
    data = bytearray(chunk_frame(START))
    data[-1] ^= 0xFF
    with pytest.raises(UpstreamError):
        _decoded(bytes(data), 0, invoke_event)


@pytest.mark.parametrize(("name", "status", "expected"), [
    ("ThrottlingException", 429, (429, "rate_limit_error")),
    ("throttlingException", 400, (429, "rate_limit_error")),
    ("ServiceQuotaExceededException", 400, (429, "rate_limit_error")),
    ("ValidationException", 400, (400, "invalid_request_error")),
    ("AccessDeniedException", 403, (403, "permission_error")),
    ("ModelStreamErrorException", 424, (500, "api_error")),
    ("ServiceUnavailableException", 503, (503, "overloaded_error")),
    ("SomethingNew", 502, (502, "api_error")),
])
def test_bedrock_exceptions_get_a_status_and_type(name: str, status: int,
                                                  expected: tuple[int, str]) -> None:
    assert mapped(name, status) == expected


def test_the_error_type_header_names_the_exception() -> None:
    status, body = anthropic_error(
        400, [(b"x-amzn-ErrorType", b"ThrottlingException:http://internal.amazon.com/")],
        b'{"message":"Too many tokens"}')
    assert status == 429
    assert orjson.loads(body)["error"] == {"type": "rate_limit_error",
                                           "message": "Too many tokens"}


def test_model_ids_profiles_and_arns_are_encoded_whole() -> None:
    assert model_path("us.anthropic.claude-sonnet-4-5-20250929-v1:0", "invoke") == \
        "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    assert model_path("arn:aws:bedrock:us-east-1:1:inference-profile/x", "converse") == \
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fx/converse"


def test_converse_stream_events_become_anthropics() -> None:
    frames = [event_frame("messageStart", {"role": "assistant"}),
              event_frame("contentBlockDelta", {"contentBlockIndex": 0,
                                                "delta": {"text": "Hi"}}),
              event_frame("contentBlockStop", {"contentBlockIndex": 0}),
              event_frame("contentBlockStart", {"contentBlockIndex": 1, "start": {
                  "toolUse": {"toolUseId": "t1", "name": "f"}}}),
              event_frame("contentBlockDelta", {"contentBlockIndex": 1,
                                                "delta": {"toolUse": {"input": "{}"}}}),
              event_frame("contentBlockStop", {"contentBlockIndex": 1}),
              event_frame("messageStop", {"stopReason": "tool_use"}),
              event_frame("metadata", {"usage": {"inputTokens": 5, "outputTokens": 2,
                                                 "cacheReadInputTokens": 3}})]
    sse = _decoded(b"".join(frames), 0, converse_event)
    translator = AnthropicStreamFromConverse("nova")
    out = translator.feed(sse) + translator.flush()
    kinds = [orjson.loads(e.split(b"data: ")[1])["type"] for e in out.split(b"\n\n")[:-1]]
    assert kinds == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert translator.done
    assert b'"stop_reason":"tool_use"' in out and b'"cache_read_input_tokens":3' in out
