"""Running request work that a client disconnect cancels (ASGI).

Both servers need it: the gateway, to stop an upstream request the moment its client
leaves, and the local engine, to abort a sequence in its batch. ASGI spec:
https://asgi.readthedocs.io/en/latest/specs/www.html
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Self, TypeVar

__all__ = ["WATCH_GRACE_S", "ClientDisconnected", "DisconnectWatch", "DisconnectWatches",
           "run_until_disconnect"]

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
        self._timer.cancel()
        _leave(self._watch, kind)


def _leave(watch: _Watch, kind: type[BaseException] | None) -> None:
    """Leaving a watched block: stop the watcher; if the client disconnected, the block's
    cancellation becomes ClientDisconnected."""
    if watch.watcher is not None:
        watch.watcher.cancel()
    if watch.disconnected:
        task = watch.task
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
        self.watcher = self.task.get_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        self.task.cancel()


class DisconnectWatches:
    """:class:`DisconnectWatch` for a server's many requests with one timer between them.

    ``with watches.watch(receive, task): await ...`` has the same contract as
    ``with DisconnectWatch(receive, grace_s, task)``, but a request costs no timer of its
    own (a timer handle made and cancelled per request is the watcher's main cost on a
    short request): one sweep every ``grace_s / 2`` while requests are in flight starts the
    watcher of each request that has already been through a full sweep interval, so a
    request's watcher starts ``grace_s / 2`` to ``grace_s`` after it began (never later than
    DisconnectWatch's). Requests that end sooner pay two set operations. Use from the event
    loop's thread only.
    """

    __slots__ = ("_aging", "_interval_s", "_loop", "_timer", "_young")

    def __init__(self, grace_s: float = WATCH_GRACE_S) -> None:
        self._interval_s = grace_s / 2
        self._young: set[_SweptWatch] = set()  # begun since the last sweep
        self._aging: set[_SweptWatch] = set()  # begun before it: started at the next one
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, receive: Receive, task: asyncio.Task[Any]) -> _SweptWatch:
        """The watch of the request running as ``task`` (its body read), for a with block."""
        w = _SweptWatch(self, task, receive)
        loop = task.get_loop()
        if self._timer is None or self._loop is not loop:
            if self._loop is not loop:  # served on another loop now (tests): start afresh
                self._young, self._aging = set(), set()
            self._loop = loop
            self._timer = loop.call_later(self._interval_s, self._sweep)
        self._young.add(w)
        return w

    def _sweep(self) -> None:
        due, self._aging, self._young = self._aging, self._young, set()
        for w in due:
            w.start()
        if self._aging and self._loop is not None:
            self._timer = self._loop.call_later(self._interval_s, self._sweep)
        else:
            self._timer = None


class _SweptWatch(_Watch):
    """One request's watch under :class:`DisconnectWatches`."""

    __slots__ = ("_owner",)

    def __init__(self, owner: DisconnectWatches, task: asyncio.Task[Any],
                 receive: Receive) -> None:
        super().__init__(task, receive)
        self._owner = owner

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        owner = self._owner
        owner._young.discard(self)
        owner._aging.discard(self)
        _leave(self, kind)
