"""Small ASGI helpers for the request path: body reading with a size limit, JSON and error
responses, header filtering. (Running work that a client disconnect cancels:
:mod:`llm_wire.asgi`.)"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from gateway.errors import GatewayError, RequestTooLarge
from gateway.types import Receive, Send
from llm_wire.asgi import ClientDisconnected

__all__ = [
    "HOP_BY_HOP",
    "forward_request_headers",
    "forward_response_headers",
    "read_body",
    "retry_after_ms",
    "send_bytes",
    "send_error",
    "send_json",
]

#: Never forwarded in either direction (RFC 9110 7.6.1), plus what the gateway recomputes
#: or replaces (host, length, keys).
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length",
    b"authorization", b"x-api-key", b"api-key", b"accept-encoding", b"x-request-id",
    b"cache-control",
})
_RESPONSE_DROP = HOP_BY_HOP | {b"content-encoding", b"date", b"server", b"set-cookie"}


async def read_body(receive: Receive, limit: int, declared: int | None = None) -> bytes:
    """The whole request body; RequestTooLarge (413) as soon as it passes ``limit`` bytes."""
    if declared is not None and declared > limit:
        raise RequestTooLarge(f"request body is {declared} bytes; the limit is {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def forward_request_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Client headers safe to pass upstream: no hop-by-hop, no keys, no gateway controls.
    (A slice compared, not ``startswith``: on Python 3.11 it parses its arguments slowly.)"""
    return [h for h in raw if h[0] not in HOP_BY_HOP and h[0][:10] != b"x-gateway-"]


def forward_response_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Upstream headers passed to the client (rate-limit, processing time, content type...).

    Header names arrive in the upstream's case; ASGI wants them lower-cased.
    """
    out = []
    for k, v in raw:
        k = k.lower()
        if k == b"x-request-id":  # ours goes back as x-request-id; keep theirs for support
            out.append((b"x-upstream-request-id", v))
        elif k not in _RESPONSE_DROP:
            out.append((k, v))
    return out


async def send_bytes(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, obj: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    out = [(b"content-type", b"application/json")] + (headers or [])
    await send_bytes(send, status, orjson.dumps(obj), out)


async def send_error(
    send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    out = [(b"content-type", b"application/json")] + (headers or [])
    out += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send_bytes(send, error.status, error.body(), out)


def retry_after_ms(headers: Sequence[tuple[bytes, bytes]]) -> float | None:
    """``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), in ms; None if absent."""
    seconds: str | None = None
    for k, v in headers:
        k = k.lower()
        if k == b"retry-after-ms":
            try:
                return max(0.0, float(v))
            except ValueError:
                continue
        if k == b"retry-after":
            seconds = v.decode("latin-1").strip()
    if seconds is None:
        return None
    try:
        return max(0.0, float(seconds) * 1000)
    except ValueError:
        when = email.utils.parsedate_to_datetime(seconds) if seconds else None
        return None if when is None else max(0.0, (when.timestamp() - time.time()) * 1000)
