"""Small ASGI helpers for the request path: body reading with a size limit, JSON and error
responses, header filtering. (Running work that a client disconnect cancels:
:mod:`llm_wire.asgi`.)"""

from __future__ import annotations

import email.utils
import operator
import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from gateway.errors import GatewayError, RequestTooLarge
from gateway.types import Receive, Send
from llm_wire.asgi import ClientDisconnected

__all__ = [
    "FORWARDED",
    "HOP_BY_HOP",
    "NEVER_FORWARDED",
    "NEVER_FORWARDED_PREFIXES",
    "HeaderAllow",
    "content_length",
    "forward_request_headers",
    "forward_response_headers",
    "read_body",
    "restrict_betas",
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

#: The client headers an upstream is sent (issue 45, finding 8): the body's type, what the
#: client accepts, the providers' versioning and beta headers (Claude Code and the SDKs
#: need them; a key's betas may be narrowed: ``auth.keys[].betas``), W3C trace context.
#: The request id is the gateway's own (the client's, when sane: gateway.endpoint). All
#: else is dropped: billing (``openai-organization``, ``openai-project``: the gateway's key
#: pays), cookies, forwarding (``forwarded``, ``x-forwarded-*``, ``x-real-ip``), hop-by-hop
#: ones and those ``connection`` names, ``idempotency-key`` (under a shared upstream key,
#: one tenant's key would replay another's answer), SDK telemetry, ``user-agent``.
FORWARDED = frozenset({
    b"content-type", b"accept", b"anthropic-version", b"anthropic-beta", b"openai-beta",
    b"traceparent", b"tracestate",
})
#: Never forwarded, whatever an upstream's ``forward_headers`` adds to :data:`FORWARDED`
#: (names; and names starting with :data:`NEVER_FORWARDED_PREFIXES`).
NEVER_FORWARDED = HOP_BY_HOP | {
    b"cookie", b"cookie2", b"set-cookie", b"forwarded", b"via", b"x-real-ip",
    b"true-client-ip", b"openai-organization", b"openai-project", b"idempotency-key",
    b"proxy-connection", b"expect",
}
NEVER_FORWARDED_PREFIXES = (b"x-gateway-", b"x-forwarded-")
_BETAS = (b"anthropic-beta", b"openai-beta")
_NAME = operator.itemgetter(0)


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
    """The client headers an upstream request carries: none that may never leave the
    gateway (hop-by-hop, keys, gateway controls, and any the ``connection`` header names,
    RFC 9110 7.6.1). The upstream then sends on only those its :class:`HeaderAllow`
    allows (:data:`FORWARDED` by default): this strips, that one chooses. (A slice
    compared, not ``startswith``: on Python 3.11 it parses its arguments slowly.)"""
    out = [h for h in raw if h[0] not in HOP_BY_HOP and h[0][:10] != b"x-gateway-"]
    if b"connection" in map(_NAME, raw):  # (a scan in C) the names it lists: this hop's
        for k, v in raw:
            if k == b"connection":
                named = {n.strip().lower() for n in v.split(b",")}
                out = [h for h in out if h[0] not in named]
    return out


class HeaderAllow:
    """Which client headers an upstream sends on: :data:`FORWARDED`, plus its config's
    ``forward_headers`` (names, or a prefix ending in ``*``: ``x-fake-*``). Raises
    ValueError for an entry that is one of :data:`NEVER_FORWARDED` or starts with
    :data:`NEVER_FORWARDED_PREFIXES`, or an empty or bare ``*`` prefix."""

    __slots__ = ("names", "prefixes")

    def __init__(self, extra: Iterable[str] = ()) -> None:
        names, prefixes = set(FORWARDED), []
        for entry in extra:
            name = entry.strip().lower().encode("latin-1")
            stem = name.removesuffix(b"*")
            if not stem or b"*" in stem or not all(33 <= c < 127 and c != 58 for c in stem):
                raise ValueError(f"forward_headers: {entry!r} is not a header name or a "
                                 "prefix such as 'x-vendor-*'")
            if stem in NEVER_FORWARDED or stem.startswith(NEVER_FORWARDED_PREFIXES) or any(
                    n.startswith(stem) for n in (*NEVER_FORWARDED, *NEVER_FORWARDED_PREFIXES)
                    if stem != name):
                raise ValueError(f"forward_headers: {entry!r} is never forwarded (credentials, "
                                 "hop-by-hop, cookies, forwarding, billing, idempotency)")
            if stem == name:
                names.add(name)
            else:
                prefixes.append(stem)
        self.names = frozenset(names)
        self.prefixes = tuple(prefixes)

    def filter(self, raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The headers of ``raw`` it allows, in order."""
        names, prefixes = self.names, self.prefixes
        return [h for h in raw if h[0] in names or (prefixes and h[0].startswith(prefixes))]


def restrict_betas(raw: list[tuple[bytes, bytes]], allowed: frozenset[str]
                   ) -> list[tuple[bytes, bytes]]:
    """``raw`` with each ``anthropic-beta`` and ``openai-beta`` header keeping only the
    comma-separated features in ``allowed`` (lower-case; a header left empty is dropped):
    a key's ``betas`` (gateway.config.GatewayKey)."""
    out = []
    for k, v in raw:
        if k in _BETAS:
            kept = [f for f in (p.strip() for p in v.decode("latin-1").split(","))
                    if f.lower() in allowed]
            if not kept:
                continue
            v = ",".join(kept).encode("latin-1")
        out.append((k, v))
    return out


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


def content_length(value: bytes | None) -> int | None:
    """The first ``content-length`` header's value read, if any and readable."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None
