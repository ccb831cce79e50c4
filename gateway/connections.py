"""The door's limits on client connections, in uvicorn's ``httptools`` protocol: what a
client may hold (a descriptor, memory, an admission slot) without using it.

- A request's line and headers past ``max_header_bytes``: 431 and the connection closed.
  httptools (llhttp) has no such limit and buffers a header whole until its end, so the
  bytes are counted as they arrive, before the parser sees them; a read that would go past
  the limit is fed only up to it.
- Timeouts, nginx's set: a request's head must be whole ``header_timeout_s`` after its
  first byte (a new connection's first request: after it opened), else 408 (slowloris);
  at most ``body_timeout_s`` between two reads of a body; an idle connection goes after
  ``keep_alive_s``; a client that takes nothing of its response (the transport paused
  writing, the app's ``send`` waits) for ``send_timeout_s`` is aborted, which the app sees
  as a disconnect (its upstream request cancelled, its admission slot freed).
- At most ``max_connections`` open: past it, the connection idle the longest (no request
  in progress: one that never sent a byte, or a keep-alive one between requests) is closed
  to make room, as nginx reuses its keep-alive connections; the new one is refused (503)
  only when none is idle. Optionally ``max_connections_per_client`` per address.

Each answer of its own (431, 408), and any response that ends before its request's body,
is followed by a lingering close (nginx's): the write side is shut, what the client still
sends is read and dropped until it has been quiet for :data:`LINGER_S` (or, sending on, for
at most :data:`LINGER_TOTAL_S`), so that it reads the answer rather than a reset.

Cost per request: no timer of its own. Each connection has one timer, armed for the
earliest moment its current wait could expire; when it fires it looks at what the
connection waits for then and closes it or re-arms (a timer armed earlier than needed
only fires early). Back-to-back requests on a keep-alive connection re-arm nothing, and
replace uvicorn's keep-alive timer, which was armed and cancelled once per request. The
send timer is armed only while writing is paused.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.connection_limits import ConnectionLimits
from gateway.errors import GatewayError, HeadersTooLarge, Overloaded, RequestTimeout

__all__ = ["LINGER_S", "LINGER_TOTAL_S", "Connections", "GuardedHttpToolsProtocol"]

#: A lingering connection (answered 431 or 408, or before its request's body ended) is
#: closed once its client has sent nothing for this long (s; nginx's lingering_timeout)...
LINGER_S = 5.0
#: ... or, a client that keeps sending, aborted this long after the answer (s; nginx's
#: lingering_time).
LINGER_TOTAL_S = 30.0
# What a connection waits for from its client.
_WAIT = 0  # a request's first byte (a new connection, or one between requests)
_HEAD = 1  # the rest of a request's head
_BODY = 2  # the rest of a request's body
_CLOSING = 3  # nothing: closed, refused, or its last response under way
_LINGER = 4  # nothing: answered, its write side shut; what comes is read and dropped


def _answer(status: int, error: GatewayError) -> bytes:
    """A whole response with ``error``'s JSON body that closes the connection."""
    body = error.body()
    head = STATUS_LINE[status] + b"content-type: application/json\r\n" \
        + b"content-length: %d\r\nconnection: close\r\n" % len(body)
    for name, value in error.headers.items():
        head += f"{name.lower()}: {value}\r\n".encode()
    return head + b"\r\n" + body


_TOO_LARGE = _answer(431, HeadersTooLarge("the request's line and headers are too large"))
_TIMED_OUT = _answer(408, RequestTimeout("the request's headers did not arrive in time"))
_FULL = _answer(503, Overloaded("the gateway has too many connections open; retry later",
                                reason="connection_limit", retry_after_s=1))


class Connections:
    """One server's connections as its limits see them: the idle ones, longest idle first
    (closed first at the cap), and how many each client address has open."""

    __slots__ = ("idle", "limits", "per_client")

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.idle: OrderedDict[GuardedHttpToolsProtocol, None] = OrderedDict()
        self.per_client: dict[str, int] = {}


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol under :class:`ConnectionLimits` (see the module's
    docstring). ``door``: the server's :class:`Connections`, for the connection caps
    (without one, only the per-connection limits apply); a server gets a subclass of its
    own with both set (:func:`gateway.serving.server_protocol`)."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    door: ClassVar[Connections | None] = None

    _state = _WAIT
    _since = 0.0  # when the current wait began (a body: the last read)
    _head_left = 0  # bytes the current request's head may still take
    _timer: asyncio.TimerHandle | None = None
    _timer_at = 0.0
    _send_timer: asyncio.TimerHandle | None = None
    _linger_end = 0.0
    _counted = False  # in door.per_client

    # Connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits, door = self.limits, self.door
        now = self._since = self.loop.time()
        self._arm(now + limits.header_timeout_s)
        if door is None:
            return
        if limits.max_connections_per_client:
            host = self.client[0] if self.client else ""
            count = door.per_client[host] = door.per_client.get(host, 0) + 1
            self._counted = True
            if count > limits.max_connections_per_client:
                self._refuse()
                return
        if limits.max_connections and len(self.connections) > limits.max_connections:
            idle = door.idle
            while idle:  # the longest idle makes room (a closing one frees its own soon)
                victim = idle.popitem(last=False)[0]
                if not victim.transport.is_closing():
                    victim._evict()
                    break
            else:
                self._refuse()
                return
        door.idle[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    def _forget(self) -> None:
        """The connection is no longer this protocol's: its timers and counts go."""
        for timer in (self._timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._send_timer = None
        door = self.door
        if door is not None:
            door.idle.pop(self, None)
            if self._counted:
                self._counted = False
                host = self.client[0] if self.client else ""
                left = door.per_client.get(host, 1) - 1
                if left > 0:
                    door.per_client[host] = left
                else:
                    door.per_client.pop(host, None)

    def _refuse(self) -> None:
        """Over a connection cap with none to close instead: 503, closed at once."""
        self._state = _CLOSING
        self.transport.write(_FULL)
        self.transport.close()

    def _evict(self) -> None:
        """Closed to make room for a new connection (it was idle): what it still had to
        send is dropped if its client is not reading."""
        self._state = _CLOSING
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    # Reading

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state == _BODY:
            self._since = self.loop.time()
            self._feed(data)
            return
        if state == _LINGER:  # dropped: the client is still sending
            self._since = self.loop.time()
            return
        cycle = self.cycle
        first = state == _WAIT
        if first:  # a request's first bytes
            state = self._state = _HEAD
            self._head_left = self.limits.max_header_bytes
            door = self.door
            if door is not None:
                door.idle.pop(self, None)
        if state != _HEAD:  # closing: what the client still sends is dropped
            return
        left = self._head_left - len(data)
        if left < 0:
            self._over(data)
            return
        self._head_left = left
        try:  # (uvicorn's data_received, but for its keep-alive timer: ours replaces it)
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parse_failed(exc)
            return
        if self._state != _HEAD:  # the whole request came in this read (nearly always)
            return
        if self.cycle is not cycle:  # the head ended, a body goes on
            self._reading_body()
        elif first and cycle is not None:
            # A keep-alive connection's head spans reads: it is timed from its first byte
            # (a new connection's first head, from the connection's opening: already armed).
            # Only then: a head that comes in one read arms nothing.
            now = self._since = self.loop.time()
            deadline = now + self.limits.header_timeout_s
            if self._timer is None or self._timer_at > deadline:
                self._arm(deadline)

    def _over(self, data: bytes | memoryview) -> None:
        """A read with more bytes than the head may still take: the parser gets only those;
        431 if the head has not ended within them, else the rest is read as usual."""
        allowed, cycle = self._head_left, self.cycle
        view = memoryview(data)
        if allowed:
            self._feed(view[:allowed])
        if self.transport.is_closing():  # a malformed request, answered 400
            return
        if self._state == _HEAD and self.cycle is cycle:
            self._end(_TOO_LARGE)
            return
        if self._state == _HEAD:
            self._reading_body()
        self.data_received(view[allowed:])  # type: ignore[arg-type]

    def _reading_body(self) -> None:
        """A request's head ended and its body goes on past this read: at most
        ``body_timeout_s`` until the next read."""
        self._state = _BODY
        now = self._since = self.loop.time()
        deadline = now + self.limits.body_timeout_s
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)

    def _feed(self, data: bytes | memoryview) -> None:
        """uvicorn's ``data_received``, but for its keep-alive timer (replaced by ours)."""
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parse_failed(exc)

    def _parse_failed(self, exc: Exception) -> None:
        """What uvicorn does when feeding its parser raised ``exc``."""
        if isinstance(exc, httptools.HttpParserError):
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        elif self._should_upgrade():
            self.handle_websocket_upgrade()
            self._forget()  # the WebSocket protocol has the connection now
        else:
            self._unsupported_upgrade_warning()

    def on_message_complete(self) -> None:
        # uvicorn's, and the next bytes begin the next request.
        self._state = _WAIT
        cycle = self.cycle
        if self.parser.should_upgrade() and self._should_upgrade():
            return
        if cycle.response_complete:  # answered before its body was read: idle from now
            if not self.pipeline:
                self._rest()
            return
        cycle.more_body = False
        cycle.message_event.set()

    # Writing

    def on_response_complete(self) -> None:
        # uvicorn's, its keep-alive timer replaced by this connection's idle wait.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._state == _WAIT:
            self._rest()

    def _rest(self) -> None:
        """No request in progress: idle from now (closed after ``keep_alive_s``, and first
        in line to make room at the connection cap)."""
        now = self._since = self.loop.time()
        door = self.door
        if door is not None:
            door.idle[self] = None
        deadline = now + self.limits.keep_alive_s
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)

    def pause_writing(self) -> None:
        self.flow.pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s,
                                                    self._send_timed_out)

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        """The client took nothing for ``send_timeout_s``: gone, as if it had disconnected
        (abort: what is buffered for it is dropped, and the app is told at once)."""
        self._send_timer = None
        self._state = _CLOSING
        self.transport.abort()

    # The connection's timer

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(at, self._tick)
        self._timer_at = at

    def _tick(self) -> None:
        """What the connection waits for now, against its limit: closed when over it,
        else the timer re-armed for when it would be."""
        self._timer = None
        transport, state, limits = self.transport, self._state, self.limits
        cycle = self.cycle
        busy = bool(self.pipeline) or (cycle is not None and not cycle.response_complete)
        if state == _CLOSING:
            if not busy:  # (else the response under way closes it as it ends)
                transport.abort()
            return
        if state == _LINGER:
            now = self.loop.time()
            if transport.is_closing():
                return
            if now >= self._linger_end:  # still sending: its bytes are not read any more
                transport.abort()
            elif now >= self._since + LINGER_S:  # quiet, all it sent read: a plain close
                transport.close()
            else:
                self._arm(min(self._since + LINGER_S, self._linger_end))
            return
        if transport.is_closing() or self.parser is None or self not in self.connections:
            return  # closed, or upgraded (the WebSocket protocol's now)
        now = self.loop.time()
        if state == _WAIT:
            if busy:
                return  # the app owes a response: its end starts the idle wait
            deadline = self._since + (limits.header_timeout_s if cycle is None
                                      else limits.keep_alive_s)
            if now >= deadline:
                self._state = _CLOSING
                transport.close()
                return
        elif state == _HEAD:
            deadline = self._since + limits.header_timeout_s
            if now >= deadline:
                self._end(_TIMED_OUT)
                return
        else:
            if self.flow.read_paused:  # the app has not taken what came: not the client's wait
                self._since = now
            deadline = self._since + limits.body_timeout_s
            if now >= deadline:  # the app reads a disconnect
                self._state = _CLOSING
                transport.close()
                return
        self._arm(deadline)

    def _end(self, answer: bytes) -> None:
        """Answer ``answer`` and close (lingering: see the module's docstring)."""
        self._state = _CLOSING
        door, transport = self.door, self.transport
        if door is not None:
            door.idle.pop(self, None)
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete):
            # Requests before it are being answered: the last one's end closes the
            # connection (nothing can be answered after it); what comes meanwhile is dropped.
            assert cycle is not None
            cycle.keep_alive = False
            return
        transport.write(answer)
        self.linger()

    def linger(self) -> None:
        """Close once what was written is out, lingering (nginx's lingering close): the
        write side is shut and what the client still sends is read and dropped, until it
        has sent nothing for :data:`LINGER_S` (then closed) or for at most
        :data:`LINGER_TOTAL_S` (then aborted), so that it reads the answer rather than a
        reset. Also for a response that ended before its request's body (a 413, a 401):
        the rest of that body would be read as the next request, so the connection is not
        reused."""
        door, transport = self.door, self.transport
        if door is not None:
            door.idle.pop(self, None)
        if not transport.can_write_eof():
            self._state = _CLOSING
            transport.close()
            return
        self._state = _LINGER
        transport.write_eof()
        self.flow.resume_reading()
        now = self._since = self.loop.time()
        self._linger_end = now + LINGER_TOTAL_S
        self._arm(now + LINGER_S)

    def shutdown(self) -> None:
        if self._state in (_CLOSING, _LINGER):
            self.transport.abort()
        else:
            super().shutdown()

