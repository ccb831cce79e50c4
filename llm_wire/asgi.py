"""Running request work that a client disconnect cancels (ASGI).

Both servers need it: the gateway, to stop an upstream request the moment its client
leaves, and the local engine, to abort a sequence in its batch. ASGI spec:
https://asgi.readthedocs.io/en/latest/specs/www.html
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Self, TypeVar

__all__ = ["WATCH_GRACE_S", "ClientDisconnected", "DisconnectWatch", "run_until_disconnect"]

T = TypeVar("T")
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

#: How long a request runs before a watcher starts listening for a client disconnect (s).
#: Requests that finish sooner (cache hits, fast upstreams, errors) never pay for the watcher
#: task (a task, a wait and a cancellation: measured at c=32, the largest single cost of a
#: short proxied stream); longer ones notice a disconnect at most this much later than it
#: happened, a few tokens' worth of upstream work.
WATCH_GRACE_S = 0.05


class ClientDisconnected(Exception):
    """The client closed the connection before the response was complete."""


async def run_until_disconnect(
    receive: Receive, work: Awaitable[T], grace_s: float = WATCH_GRACE_S
) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ClientDisconnected.

    Call only after the request body was read: from then on, ``receive()`` returns nothing
    but ``http.disconnect`` (ASGI spec). ``work`` runs in the calling task; a watcher task,
    started after ``grace_s``, cancels it on disconnect.
    """
    with DisconnectWatch(receive, grace_s):
        return await work


class DisconnectWatch:
    """``with DisconnectWatch(receive): await ...``: :func:`run_until_disconnect` for a block
    of awaits, without a coroutine of its own (on a hot path every frame in the await chain
    is paid again each time the work resumes: once per streamed chunk). Leaving the block
    because the client disconnected raises ClientDisconnected. Same contract: the request
    body was read, the block runs in the calling task."""

    __slots__ = ("_timer", "_watch")

    def __init__(self, receive: Receive, grace_s: float = WATCH_GRACE_S,
                 task: asyncio.Task[Any] | None = None) -> None:
        """``task``: the running task, when the caller has it at hand (found otherwise: on
        Python 3.11 that costs a getpid() system call, see asyncio.get_running_loop)."""
        if task is None:
            task = asyncio.current_task(asyncio.get_running_loop())
            assert task is not None, "DisconnectWatch needs a running task"
        loop = task.get_loop()
        self._watch = _Watch(task, receive)
        self._timer = loop.call_later(grace_s, self._watch.start)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        watch, task = self._watch, self._watch.task
        self._timer.cancel()
        if watch.watcher is not None:
            watch.watcher.cancel()
        if watch.disconnected:
            if kind is not None and issubclass(kind, asyncio.CancelledError):
                task.uncancel()
                raise ClientDisconnected() from None
            if task.cancelling():  # the client left as the work finished
                task.uncancel()


class _Watch:
    """The watcher of one request, made only once its grace period is over."""

    __slots__ = ("disconnected", "receive", "task", "watcher")

    def __init__(self, task: asyncio.Task[Any], receive: Receive) -> None:
        self.task = task
        self.receive = receive
        self.disconnected = False
        self.watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        self.task.cancel()
