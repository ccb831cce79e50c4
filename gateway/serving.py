"""The HTTP/1.1 server protocol: uvicorn's httptools protocol, with each response's status
line and headers sent in the same write as the first body bytes.

uvicorn writes a response head the moment the app sends ``http.response.start``, and the
body with the next message: two ``send()`` system calls and two TCP segments for every
answer, and the client wakes up twice (once for the head, once for the body). Holding the
head until the next write (or the end of the event-loop iteration, if no body follows at
once) makes it one, as aiohttp's server and nginx do. Measured at concurrency 32 on the
fake upstream (bench/overhead.py's workload): about 4% less proxy CPU per request.

Each response is also sent by :class:`LeanCycle`, uvicorn's request-response cycle with a
shorter ``send``: a response head's header names and values are checked by deleting the
allowed bytes from all of them at once (``bytes.translate``; uvicorn runs two regex
searches per header: 22 for a gateway answer), and a body write takes the shortest way. Every unusual case (a paused
or closed transport, an access log, a ``HEAD`` request, a message out of order) is
uvicorn's own ``send``.

The protocol is :class:`~gateway.connections.GuardedHttpToolsProtocol` (the door's limits on
connections); :func:`server_protocol` makes the class one server runs, with its limits.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from typing import Any, NoReturn

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

from gateway.connection_limits import ConnectionLimits
from gateway.connections import Connections, GuardedHttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol", "HeadCoalescingTransport", "LeanCycle",
           "server_protocol"]

_HEAD = b"HTTP/1."


class HeadCoalescingTransport(asyncio.Transport):
    """Wraps a transport: a write that starts a response head (``HTTP/1.x ...``) is held and
    sent with the next write, or at the end of the current event-loop iteration, whichever
    comes first. Order is kept: a write, ``writelines``, ``write_eof`` or ``close`` first
    sends what is held. Everything else is the wrapped transport's, method by method (no
    ``__getattr__``: a class with one looks every attribute up through it, ~700
    instructions an access)."""

    __slots__ = ("_held", "_loop", "_transport", "on_close")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        #: Called once instead of closing (then it closes itself): a lingering close.
        self.on_close: Callable[[], None] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + bytes(data))
        elif data[:7] == _HEAD:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send what is held, if anything."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def writelines(self, list_of_data: Any) -> None:
        self.flush()
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        on_close = self.on_close
        if on_close is not None:
            self.on_close = None
            on_close()
            return
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def abort(self) -> None:
        self._transport.abort()


#: Header names whose values change how the body is framed or the connection kept.
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})
#: The bytes uvicorn allows in a header name, and in a value.
_NAME_BYTES = bytes(b for b in range(256) if HEADER_RE.match(bytes([b])) is None)
_VALUE_BYTES = bytes(b for b in range(256) if HEADER_VALUE_RE.match(bytes([b])) is None)
_NAME = operator.itemgetter(0)
_LINE = b": ".join  # a (name, value) pair as its header line, without the line end


def _reject(headers: list[tuple[bytes, bytes]]) -> NoReturn:
    """Raise what uvicorn raises for a response head with a bad header: its checks and its
    parse of content-length, header after header, until the first that fails."""
    chunked: bool | None = None
    for name, value in headers:
        if HEADER_RE.search(name):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
        name = name.lower()
        if name == b"content-length" and chunked is None:
            int(value.decode())
            chunked = False
        elif name == b"transfer-encoding" and value.lower() == b"chunked":
            chunked = True
    raise AssertionError("no bad header found")  # never: the caller found one


class LeanCycle(RequestResponseCycle):
    """uvicorn's request-response cycle with a shorter ``send`` for the common cases (see
    the module's docstring); what it writes is what uvicorn's would, byte for byte."""

    #: The head went out through :meth:`_start` (so no access log, no HEAD): the body's
    #: writes take the short way while the transport takes them.
    _lean = False

    async def send(self, message: Any) -> None:
        if self._lean and message["type"] == "http.response.body" and not (
                self.response_complete or self.flow.write_paused or self.disconnected):
            self._body(message.get("body", b""), message.get("more_body", False))
        elif self.flow.write_paused or self.disconnected or self.access_log \
                or self.scope["method"] == "HEAD":
            if message["type"] == "http.response.start" and self.more_body:
                self._early()
            await super().send(message)
        elif not self.response_started:
            if message["type"] != "http.response.start":
                await super().send(message)  # raises
            else:
                self._start(message)
        elif self.response_complete or message["type"] != "http.response.body":
            await super().send(message)  # raises
        else:
            self._body(message.get("body", b""), message.get("more_body", False))

    def _start(self, message: Any) -> None:
        self.response_started = self._lean = True
        self.waiting_for_100_continue = False
        status = message["status"]
        headers = self.default_headers + list(message.get("headers", []))
        # One pass in C over the pairs for each job (bytes.join over a map), not a Python
        # loop over the headers (~2.5k instructions a header).
        names = b"".join(map(_NAME, headers))
        if not names.islower():  # uvicorn sends the names lower-cased (ours already are)
            headers = [(name.lower(), value) for name, value in headers]
        head = STATUS_LINE[status] + b"\r\n".join(map(_LINE, headers))
        if headers:
            head += b"\r\n"
        # uvicorn's check, two regex searches per header (a character class each), is made
        # by deleting the allowed bytes: of the names none may be left, of the head only the
        # line ends. Anything else is checked again as uvicorn does, to raise as it would.
        if names.translate(None, _NAME_BYTES) \
                or head.translate(None, _VALUE_BYTES) != b"\r\n" * (len(headers) + 1):
            _reject(headers)
        framing = [(name, value) for name, value in headers if name in _FRAMING]
        has_connection_close = False
        for name, value in framing:
            if name == b"content-length":
                if self.chunked_encoding is None:
                    self.expected_content_length = int(value.decode())
                    self.chunked_encoding = False
            elif name == b"transfer-encoding":
                if value.lower() == b"chunked":
                    self.expected_content_length = 0
                    self.chunked_encoding = True
            elif b"close" in [token.lower().strip() for token in value.split(b",")]:
                self.keep_alive = False
                has_connection_close = True
        if self.more_body:
            self._early()
        tail = b""
        if not self.keep_alive and not has_connection_close:
            tail = b"connection: close\r\n"
        if self.chunked_encoding is None and status not in (204, 304):
            self.chunked_encoding = True
            tail += b"transfer-encoding: chunked\r\n"
        self.transport.write(head + tail + b"\r\n")

    def _early(self) -> None:
        """The response starts before its request's body ended (a 413, a 401): the
        connection is not reused (the rest of that body would be read as the next request),
        and its close lingers (GuardedHttpToolsProtocol.linger), so a client still sending
        reads this answer rather than a reset."""
        self.keep_alive = False
        transport = self.transport
        protocol = transport.get_protocol()
        if isinstance(transport, HeadCoalescingTransport) \
                and isinstance(protocol, GuardedHttpToolsProtocol):
            transport.on_close = protocol.linger

    def _body(self, body: bytes, more_body: bool) -> None:
        if self.chunked_encoding:
            if body:
                out = b"%x\r\n%b\r\n" % (len(body), body)
                self.transport.write(out if more_body else out + b"0\r\n\r\n")
            else:
                self.transport.write(b"" if more_body else b"0\r\n\r\n")
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            self.transport.write(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


class CoalescingHttpToolsProtocol(GuardedHttpToolsProtocol):
    """uvicorn's ``httptools`` protocol over a :class:`HeadCoalescingTransport`, its
    responses sent by :class:`LeanCycle`, under the door's limits (a server runs the class
    :func:`server_protocol` makes: ``uvicorn.Config(http=server_protocol(limits))``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadCoalescingTransport(transport, self.loop))

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # uvicorn made the cycle and scheduled (or queued) its run_asgi, which has not
        # started yet: it finds LeanCycle's send. (Upgrades make no cycle.)
        cycle = self.cycle
        if cycle is not None and type(cycle) is RequestResponseCycle:
            cycle.__class__ = LeanCycle


def server_protocol(limits: ConnectionLimits) -> type[CoalescingHttpToolsProtocol]:
    """The protocol class for one server (``uvicorn.Config(http=...)``):
    :class:`CoalescingHttpToolsProtocol` under ``limits``, with a table of its own
    connections (the caps count them)."""

    class ServerProtocol(CoalescingHttpToolsProtocol):
        pass

    ServerProtocol.limits = limits
    ServerProtocol.door = Connections(limits)
    return ServerProtocol
