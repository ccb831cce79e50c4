"""Small ASGI helpers for the request path: body reading with a size limit, JSON and error
responses, header filtering, and running work that a client disconnect cancels."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import orjson

from gateway.errors import GatewayError, RequestTooLarge
from gateway.types import Receive, Send

__all__ = [
    "HOP_BY_HOP",
    "WATCH_GRACE_S",
    "ClientDisconnected",
    "forward_request_headers",
    "forward_response_headers",
    "read_body",
    "run_until_disconnect",
    "send_bytes",
    "send_error",
    "send_json",
]

T = TypeVar("T")

#: Never forwarded in either direction (RFC 9110 7.6.1), plus what the gateway recomputes
#: or replaces (host, length, keys).
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length",
    b"authorization", b"x-api-key", b"api-key", b"accept-encoding", b"x-request-id",
    b"cache-control",
})
_RESPONSE_DROP = HOP_BY_HOP | {b"content-encoding", b"date", b"server", b"set-cookie"}


class ClientDisconnected(Exception):
    """The client closed the connection before the response was complete."""


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


#: How long a request runs before the gateway starts watching for a client disconnect (s).
#: Requests that finish sooner (cache hits, fast upstreams) never pay for the watcher task;
#: longer ones notice a disconnect at most this much later than it happened.
WATCH_GRACE_S = 0.02


async def run_until_disconnect(
    receive: Receive, work: Awaitable[T], grace_s: float = WATCH_GRACE_S
) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ClientDisconnected.

    Call only after the request body was read: from then on, ``receive()`` returns nothing
    but ``http.disconnect`` (ASGI spec). ``work`` runs in the calling task; a watcher task,
    started after ``grace_s``, cancels it on disconnect.
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    disconnected = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal disconnected
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(grace_s, start_watching)
    try:
        return await work
    except asyncio.CancelledError:
        if disconnected:
            task.uncancel()
            raise ClientDisconnected() from None
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
        if disconnected and task.cancelling():  # the client left just as the work finished
            task.uncancel()


def forward_request_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Client headers safe to pass upstream: no hop-by-hop, no keys, no gateway controls."""
    return [(k, v) for k, v in raw if k not in HOP_BY_HOP and not k.startswith(b"x-gateway-")]


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
