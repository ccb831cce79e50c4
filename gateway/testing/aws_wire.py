"""What the Bedrock fakes share: an AWS error, and the ASGI sends of a JSON answer and of
an event-stream body (gateway.testing.fake_bedrock, gateway.testing.fake_converse)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.testing.fake_upstream import Record
from gateway.types import Send

__all__ = ["AwsError", "send_body", "send_json", "start_stream"]

_STREAM = [(b"content-type", b"application/vnd.amazon.eventstream")]


class AwsError(Exception):
    """A Bedrock error answer: ``status``, the exception's ``name``, its message (sent as
    ``x-amzn-ErrorType: Name:namespace`` and ``{"message": ...}``)."""

    def __init__(self, status: int, name: str, message: str) -> None:
        super().__init__(message)
        self.status, self.name, self.message = status, name, message

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"x-amzn-errortype",
                 f"{self.name}:http://internal.amazon.com/coral/com.amazon.bedrock/".encode())]


async def start_stream(send: Send, rec: Record) -> None:
    """A 200 event-stream answer's head."""
    await send({"type": "http.response.start", "status": 200, "headers": _STREAM})
    rec.first_byte = time.monotonic()


async def send_body(send: Send, data: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def send_json(send: Send, rec: Record, status: int, obj: Any,
                    extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps(obj)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *(extra or [])]})
    rec.first_byte = time.monotonic()
    await send({"type": "http.response.body", "body": body})
