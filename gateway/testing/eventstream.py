"""A test-only encoder of AWS event-stream frames (botocore decodes them but has no
encoder), as Bedrock's streaming responses frame their events: a 12-byte prelude (the
frame's total length and its headers' length, big-endian uint32, then the CRC32 of those 8
bytes), the headers (each: name length as one byte, the name, value type 7 = string, value
length as a big-endian uint16, the value), the payload, and the CRC32 of everything before
it. tests/gateway/providers/test_bedrock_frames.py proves it round-trips through botocore's
:class:`~botocore.eventstream.EventStreamBuffer`.
Source: https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html#streaming-event-stream
"""

from __future__ import annotations

import base64
import struct
from binascii import crc32
from typing import Any

import orjson

__all__ = ["chunk_frame", "event_frame", "exception_frame", "frame"]

_STRING = 7


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: ``headers`` (string values) and ``payload``."""
    encoded = b"".join(
        struct.pack(">B", len(n := name.encode())) + n + struct.pack(">BH", _STRING, len(v))
        + v for name, v in ((k, value.encode()) for k, value in headers.items()))
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    head = prelude + struct.pack(">I", crc32(prelude)) + encoded + payload
    return head + struct.pack(">I", crc32(head))


def event_frame(event_type: str, payload: Any) -> bytes:
    """An ``event`` message of ``event_type`` with a JSON ``payload`` (ConverseStream's)."""
    return frame({":event-type": event_type, ":content-type": "application/json",
                  ":message-type": "event"}, orjson.dumps(payload))


def chunk_frame(event: dict[str, Any]) -> bytes:
    """InvokeModelWithResponseStream's ``chunk`` event carrying one Anthropic stream event
    (its JSON, base64, in ``bytes``)."""
    return event_frame("chunk", {"bytes": base64.b64encode(orjson.dumps(event)).decode()})


def exception_frame(exception_type: str, message: str) -> bytes:
    """An ``exception`` message (``throttlingException``, ``modelStreamErrorException``...)."""
    return frame({":exception-type": exception_type, ":content-type": "application/json",
                  ":message-type": "exception"}, orjson.dumps({"message": message}))
