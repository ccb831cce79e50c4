"""Bedrock's streamed answers, decoded where they enter: the AWS event-stream framing
(binary frames: a prelude with the lengths and its CRC32, headers ``:message-type``,
``:event-type`` or ``:exception-type``, ``:content-type``, a JSON payload, the frame's
CRC32), parsed by botocore's :class:`~botocore.eventstream.EventStreamBuffer`, and turned
into the SSE bytes the rest of the gateway reads:

- InvokeModelWithResponseStream (``api = "anthropic"``): each ``chunk`` event's payload is
  ``{"bytes": base64}`` of one Anthropic stream event, sent on as
  ``event: <its type>\\ndata: <its JSON>\\n\\n``, byte for byte the Messages API's stream;
- ConverseStream (``api = "converse"``): each event (``messageStart``,
  ``contentBlockDelta``...) as ``event: <its :event-type>\\ndata: <its payload>\\n\\n``
  (gateway.formats.converse_stream reads them);
- an exception frame, either way (``throttlingException``, ``modelStreamErrorException``,
  ``internalServerException``...; or a frame of ``:message-type`` ``error``): an Anthropic
  ``event: error`` (gateway.upstreams.bedrock_errors), which the stream watch retries
  before the first token when it is the server's fault, and the relay ends a client's
  stream with, in the client's format, after it.

A frame that fails its checksum ends the stream as a broken response (UpstreamError).
Sources: https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html#streaming-event-stream
(the frame layout), https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html,
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from botocore.eventstream import EventStreamBuffer, ParserError

from gateway.errors import UpstreamError
from gateway.upstreams.base import UpstreamResponse
from gateway.upstreams.bedrock_errors import anthropic_error

__all__ = ["EventStreamResponse", "converse_event", "invoke_event"]

Decode = Callable[[Any], bytes]


def _sse(name: bytes, data: bytes) -> bytes:
    if b"\n" in data or b"\r" in data:  # one data line: JSON with its own newlines, compacted
        data = orjson.dumps(orjson.loads(data))
    return b"event: " + name + b"\ndata: " + data + b"\n\n"


def _failure(message: Any) -> bytes:
    """An exception or error frame as an Anthropic ``error`` event."""
    headers = message.headers
    name = headers.get(":exception-type") or headers.get(":error-code") or ""
    raw = message.payload or orjson.dumps({"message": headers.get(":error-message", name)})
    _, body = anthropic_error(500, (), raw, str(name))
    return b"event: error\ndata: " + body + b"\n\n"


def invoke_event(message: Any) -> bytes:
    """One frame of InvokeModelWithResponseStream as the Anthropic SSE event it carries
    (b"" for an event of another kind)."""
    headers = message.headers
    if headers.get(":message-type") != "event":
        return _failure(message)
    if headers.get(":event-type") != "chunk":
        return b""
    try:
        data = base64.b64decode(orjson.loads(message.payload)["bytes"], validate=True)
        kind = orjson.loads(data)["type"]
    except (orjson.JSONDecodeError, KeyError, TypeError, binascii.Error) as exc:
        raise UpstreamError("Bedrock sent a stream chunk that is not an event") from exc
    return _sse(str(kind).encode(), data)


def converse_event(message: Any) -> bytes:
    """One frame of ConverseStream as ``event: <type>`` and its JSON payload."""
    headers = message.headers
    if headers.get(":message-type") != "event":
        return _failure(message)
    return _sse(str(headers.get(":event-type", "")).encode(), message.payload or b"{}")


class EventStreamResponse(UpstreamResponse):
    """A 200 event-stream response read as SSE bytes (``decode``: :func:`invoke_event` or
    :func:`converse_event`); the stall watch and closing are the inner response's."""

    __slots__ = ("_decode", "_inner", "headers", "status")

    def __init__(self, inner: UpstreamResponse, decode: Decode) -> None:
        self._inner, self._decode = inner, decode
        self.status = inner.status
        self.headers = [(k, v) for k, v in inner.headers if k.lower() not in (
            b"content-type", b"content-length")] + [(b"content-type", b"text/event-stream")]

    def iter_chunks(self, idle_s: float = 0.0) -> AsyncIterator[bytes]:
        return self._decoded(self._inner.iter_chunks(idle_s))

    async def _decoded(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        buffer, decode = EventStreamBuffer(), self._decode
        async for chunk in chunks:
            buffer.add_data(chunk)
            try:
                out = b"".join([decode(message) for message in buffer])
            except ParserError as exc:
                raise UpstreamError("Bedrock's event stream broke (a bad frame)") from exc
            if out:
                yield out

    def watch_idle(self, idle_s: float, on_stall: Callable[[], None]) -> None:
        self._inner.watch_idle(idle_s, on_stall)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_chunks()])

    def at_eof(self) -> bool:
        return self._inner.at_eof()

    def close(self) -> None:
        self._inner.close()


