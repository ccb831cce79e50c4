"""Graceful shutdown: on SIGTERM the gateway drains instead of dropping what it serves.

:meth:`Drain.begin` (called from the server's signal handling, see ``gateway serve``) turns
``/readyz`` to 503 and refuses new model requests with a 503 ``shutting_down`` error in the
caller's format (a load balancer stops sending; the listening socket is closed by the
server too). Requests in flight go on. At the deadline, ``drain_timeout_s`` less a margin
for the engine to stop, those still running are ended: a stream gets an error event in its
client's format (never a fake end event), an unanswered request a 503; their upstream calls
(and the local engine's sequences) are cancelled. The server then stops, and the app's
shutdown stops the engine child. Kubernetes sends SIGTERM and waits
``terminationGracePeriodSeconds`` (30 s by default) before SIGKILL: keep the drain timeout
below it.
"""

from __future__ import annotations

import asyncio

from gateway.errors import GatewayError

__all__ = ["Drain", "ShuttingDown"]


class ShuttingDown(GatewayError):
    status = 503
    type = "overloaded_error"
    code = "shutting_down"


class Drain:
    """``draining``: new requests are refused; ``expired``: the deadline passed and the
    requests still in ``tasks`` were cancelled."""

    __slots__ = ("_loop", "draining", "expired", "tasks")

    def __init__(self) -> None:
        self.draining = False
        self.expired = False
        self.tasks: set[asyncio.Task[object]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the gateway serves on (for :meth:`begin_threadsafe`)."""
        self._loop = loop

    def begin_threadsafe(self, timeout_s: float) -> None:
        """:meth:`begin` from a signal handler or another thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.begin, timeout_s)

    def begin(self, timeout_s: float) -> None:
        """Start draining (idempotent); requests still running after ``deadline(timeout_s)``
        seconds are ended."""
        if self.draining:
            return
        self.draining = True
        asyncio.get_running_loop().call_later(deadline(timeout_s), self.expire)

    def expire(self) -> None:
        self.expired = True
        for task in list(self.tasks):
            task.cancel()

    @staticmethod
    def error() -> ShuttingDown:
        return ShuttingDown("the gateway is shutting down; retry on another replica",
                            headers={"Retry-After": "1", "Connection": "close"})


def deadline(timeout_s: float) -> float:
    """When in-flight requests are ended (s after SIGTERM): 2 s before the drain timeout,
    leaving time to stop the engine child, or half of a timeout under 4 s."""
    return timeout_s - 2.0 if timeout_s >= 4.0 else timeout_s / 2
