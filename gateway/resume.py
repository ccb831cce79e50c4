"""Streams a client can resume after its connection dropped (issue 48, item 4).

With the policy's ``[streaming] resume`` on, :class:`Resumable` wraps a model endpoint (an
ASGI wrapper: the endpoint itself is unchanged). Each SSE answer it sends is kept in the
:class:`~gateway.stream_store.StreamStore` as the client gets it: every event ends with an
``id: N`` line (0, 1, 2... per stream; comments such as ``: keepalive`` get none), and the
answer's head names the stream: ``x-gateway-stream-id: gws_<32 hex>``.

**Resuming.** The same request sent again with ``x-gateway-stream-id`` and
``Last-Event-ID: N`` (the last id the client read; none: from the start) is answered
from the store, not the pipeline: the events after N, then the rest live while the
upstream still streams, then the stream's own end (its ``[DONE]``, ``message_stop``,
``response.completed``, or its error event). The body is read and not looked at. A
Responses stream also answers to the Responses API's own form, ``GET
/v1/responses/{id}?stream=true&starting_after=N`` (its ids are its events'
``sequence_number``). A stream is found only under the gateway key that made it, through
the API that made it: another key's, an unknown or an expired one is the same 404 in the
caller's format.

**Leaving.** A client that leaves while its stream is live does not cancel the upstream at
once when ``[streaming] resume_grace_ms`` > 0: the disconnect reaches the endpoint's
watcher (which cancels the upstream, as always) only once no client has read the stream
for that long; a resumed client reading it holds it. Meanwhile the stream's events are
kept. A stream cut so (or by the drain) ends, for a later reader, with an error event in
its format, never a clean end. 0 keeps the immediate cancel.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import Any
from urllib.parse import parse_qs

import orjson
import structlog
from starlette.routing import request_response

from gateway.errors import GatewayError, InvalidRequest, StreamAbandoned, StreamNotFound
from gateway.formats.apis import RESPONSES, ApiFormat
from gateway.http import read_body, send_bytes
from gateway.state import Gateway
from gateway.stream_store import STREAM_ID_PREFIX, KeptStream, Source, StreamStore
from gateway.types import ASGIApp, Message, Receive, Scope, Send
from llm_wire.asgi import ClientDisconnected, DisconnectWatch
from llm_wire.sse import parse_event

__all__ = ["STREAM_HEADER", "ResponseStreamGet", "Resumable"]

log = structlog.get_logger("gateway.resume")

#: The response header naming a kept stream, and the request header naming one to resume.
STREAM_HEADER = b"x-gateway-stream-id"
_LAST_EVENT_ID = b"last-event-id"
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # a response id worth keeping (as the store's)
_SID = re.compile(STREAM_ID_PREFIX + "[0-9a-f]{32}")  # a stream id (anything else: 404)


class Resumable:
    """ASGI wrapper of the model endpoint ``endpoint`` serving ``api``: keeps its streams,
    and answers resume requests (see the module docstring)."""

    def __init__(self, gw: Gateway, store: StreamStore, endpoint: ASGIApp,
                 api: ApiFormat) -> None:
        self.gw, self.store, self.endpoint, self.api = gw, store, endpoint, api

    # Not ``async``: it returns the endpoint's own coroutine where nothing is kept (one
    # frame less on every resumption of the request, as gateway.dispatch does).
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        for name, value in headers:
            if name == STREAM_HEADER:  # a resume, whatever the policy says now
                return self._resume(scope, receive, send, value)
        streaming = self.gw.runtime.policy.streaming
        if not streaming.resume:
            return self.endpoint(scope, receive, send)
        return self._kept(scope, receive, send, streaming.resume_grace_ms / 1000)

    async def _kept(self, scope: Scope, receive: Receive, send: Send, grace_s: float) -> None:
        keeper = _Keeper(self, scope["headers"], grace_s, send, receive)
        try:
            await self.endpoint(scope, keeper.receive, keeper.send)
        finally:
            keeper.close()

    async def _resume(self, scope: Scope, receive: Receive, send: Send, name: bytes) -> None:
        headers = scope["headers"]
        try:
            tenant = self.gw.auth.check(headers)
            await read_body(receive, self.gw.config.server.max_body_bytes)
            sid = name.decode("latin-1")
            stream = await self.store.lookup(tenant, sid) if _SID.fullmatch(sid) else None
            if stream is None or stream.api != self.api.name:
                raise StreamNotFound(_NOT_FOUND)
            after = _last_event_id(headers, stream)
        except GatewayError as exc:
            await _refuse(send, self.api, exc)
            return
        except ClientDisconnected:
            return
        await replay(stream, after, send, receive, self.api)


class ResponseStreamGet:
    """``GET /v1/responses/{id}``: with ``stream=true``, the kept stream of that response
    from ``starting_after`` on (the Responses API's own resume); else ``stored``."""

    def __init__(self, gw: Gateway, store: StreamStore, stored: Any) -> None:
        self.gw, self.store = gw, store
        self.stored = request_response(stored)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if query.get("stream", [""])[-1].lower() != "true":
            await self.stored(scope, receive, send)
            return
        try:
            tenant = self.gw.auth.check(scope["headers"])
            rid = scope["path_params"]["id"]
            stream = await self.store.lookup_response(tenant, rid) if _ID.fullmatch(rid) \
                else None
            if stream is None:
                raise StreamNotFound(_NOT_FOUND)
            after = _after(query.get("starting_after", ["-1"])[-1], stream, "starting_after")
        except GatewayError as exc:
            await _refuse(send, RESPONSES, exc)
            return
        await replay(stream, after, send, receive, RESPONSES)


_NOT_FOUND = "no such stream for this key (unknown, expired or no longer kept)"


async def replay(stream: Source, after: int, send: Send, receive: Receive,
                 api: ApiFormat) -> None:
    """Send ``stream``'s events after id ``after``, then the rest as they come, then its
    end; the client holds the stream (its upstream is not cancelled) while it reads."""
    stream.attach()
    at, outcome = after + 1, "ended"
    try:
        with DisconnectWatch(receive):
            await send({"type": "http.response.start", "status": 200, "headers": [
                *_SSE_HEADERS, (STREAM_HEADER, stream.id.encode())]})
            while True:
                try:
                    events, ended = await stream.read(at)
                except GatewayError as exc:  # no longer kept (evicted), the store down
                    outcome = exc.code or "error"
                    await send({"type": "http.response.body", "more_body": False,
                                "body": api.error_event(exc)})
                    return
                at += len(events)
                await send({"type": "http.response.body", "body": b"".join(events),
                            "more_body": not ended})
                if ended:
                    return
    except ClientDisconnected:
        outcome = "left"
    finally:
        stream.detach()
        log.info("stream_resumed", stream_id=stream.id, after=after, sent_to=at - 1,
                 outcome=outcome)


class _Keeper:
    """One request's ``send`` and ``receive``, seen by the endpoint: an SSE answer's events
    stamped and kept as they go out; a disconnect held back by the grace period."""

    __slots__ = ("_receive", "_send", "gone", "grace_s", "headers", "owner", "stream")

    def __init__(self, owner: Resumable, headers: list[tuple[bytes, bytes]], grace_s: float,
                 send: Send, receive: Receive) -> None:
        self.owner, self.headers, self.grace_s = owner, headers, grace_s
        self._send, self._receive = send, receive
        self.stream: KeptStream | None = None
        self.gone = False  # the first client left (its disconnect seen)

    async def send(self, message: Message) -> None:
        stream = self.stream
        if stream is None:
            if message["type"] == "http.response.start" and message["status"] == 200 \
                    and _is_sse(message.get("headers", ())):
                owner = self.owner  # the endpoint authenticated the key already
                stream = self.stream = owner.store.open(owner.gw.auth.check(self.headers),
                                                        owner.api.name)
                message = {**message, "headers": [*message["headers"],
                                                  (STREAM_HEADER, stream.id.encode())]}
            await self._send(message)
            return
        store = self.owner.store
        body, new = stream.stamp(message.get("body", b""))
        if new:
            stream.add(new)
            if stream.response_id is None and stream.api == "responses":
                _name_response(store, stream, new)
            store.grew(stream)
        more = message.get("more_body", False)
        if not more:
            stream.end()
            store.ended(stream)
        if not self.gone:
            await self._send({"type": "http.response.body", "body": body, "more_body": more})

    async def receive(self) -> Message:
        message = await self._receive()
        stream = self.stream
        if message["type"] == "http.disconnect" and stream is not None and not self.gone \
                and not stream.ended:
            self.gone = True
            stream.detach()
            if self.grace_s > 0:  # the watcher hears of it (and cancels) only after this
                await stream.abandoned(self.grace_s)
        return message

    def close(self) -> None:
        """The endpoint is done: a stream it did not end (cancelled: its client gone past
        the grace period) ends with an error event for a later reader."""
        stream = self.stream
        if stream is None:
            return
        if not self.gone:
            stream.detach()
        if not stream.ended:
            stream.end(self.owner.api.error_event(StreamAbandoned(
                "the stream was cancelled: no client read it within the grace period")))
            self.owner.store.ended(stream)


def _is_sse(headers: Any) -> bool:
    for name, value in headers:
        if name == b"content-type":
            return bool(value.startswith(b"text/event-stream"))
    return False


def _name_response(store: StreamStore, stream: KeptStream, events: list[bytes]) -> None:
    """Note a Responses stream's response id from its opening event (``response.created``:
    ``{"response": {"id": ...}}``); looked for in its first events only."""
    for event in events:
        _, data = parse_event(event)
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        response = obj.get("response") if isinstance(obj, dict) else None
        rid = response.get("id") if isinstance(response, dict) else None
        if isinstance(rid, str) and _ID.fullmatch(rid):
            store.named(stream, rid)
            return
    if stream.count >= 4:  # none in its opening: it will not be named
        stream.response_id = ""


def _last_event_id(headers: list[tuple[bytes, bytes]], stream: Source) -> int:
    for name, value in headers:
        if name == _LAST_EVENT_ID:
            return _after(value.decode("latin-1").strip(), stream, "Last-Event-ID")
    return -1  # none read: from the start


def _after(value: str, stream: Source, param: str) -> int:
    """The id a client read last, checked against what ``stream`` sent: -1 (none) to its
    last id; else 400."""
    try:
        after = int(value)
    except ValueError:
        after = -2
    if not -1 <= after < stream.count:
        raise InvalidRequest(f"{param} must be the id of an event this stream sent (an "
                             "integer from 0), or -1", param=param, code="invalid_value")
    return after


async def _refuse(send: Send, api: ApiFormat, exc: GatewayError) -> None:
    headers = [(b"content-type", b"application/json")]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send_bytes(send, api.error_status(exc), api.error_body(exc), headers)
