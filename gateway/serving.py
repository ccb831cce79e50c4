"""The HTTP/1.1 server protocol: uvicorn's httptools protocol, with each response's status
line and headers sent in the same write as the first body bytes.

uvicorn writes a response head the moment the app sends ``http.response.start``, and the
body with the next message: two ``send()`` system calls and two TCP segments for every
answer, and the client wakes up twice (once for the head, once for the body). Holding the
head until the next write (or the end of the event-loop iteration, if no body follows at
once) makes it one, as aiohttp's server and nginx do. Measured at concurrency 32 on the
fake upstream (bench/overhead.py's workload): about 4% less proxy CPU per request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol", "HeadCoalescingTransport"]

_HEAD = b"HTTP/1."


class HeadCoalescingTransport:
    """Wraps a transport: a write that starts a response head (``HTTP/1.x ...``) is held and
    sent with the next write, or at the end of the current event-loop iteration, whichever
    comes first. Order is kept: anything the transport is asked to do first sends what is
    held. Everything else is the wrapped transport's."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

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

    def writelines(self, data: Any) -> None:
        self.flush()
        self._transport.writelines(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    # Asked on every response: looked up here, not through __getattr__ (which Python calls
    # only after a failed lookup has built an AttributeError, a few microseconds each).
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol over a :class:`HeadCoalescingTransport` (pass the
    class as ``uvicorn.Config(http=...)``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = HeadCoalescingTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]
