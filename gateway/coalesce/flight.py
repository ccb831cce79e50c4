"""Calls in flight, each shared by the identical requests that come while it runs.

:meth:`Flights.join` makes the first request of a key the call's leader: the rest of its
pipeline (down to the upstream) runs as a task of its own, so no one client's leaving
cancels it. Every request of that key that comes before the answer is complete joins the
call and waits for the same reply: a whole answer is handed to each as it is; a stream is
read from the upstream once, by the flight itself, and each client gets its own view of it:
the bytes already read (a late joiner's first chunk holds everything sent so far), then
each new piece as it arrives, then the upstream's end or its failure. A client that leaves
leaves only its own view; when the last one has left, the call is cancelled (the upstream
connection dropped, so the upstream stops) or, once complete, closed, with the outcome of
the best-served client (delivered if any client got the whole answer).

Cost per request that is not shared: one dict lookup and one task; per streamed piece, one
list append and one event set.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gateway.context import Outcome, Reply, RequestContext
from gateway.errors import UpstreamError

__all__ = ["Flight", "Flights"]


class Flights:
    """The calls in flight, by key. ``led``: calls made; ``joined``: requests served by a
    call another request made (Prometheus: ``gateway_coalesced_requests_total``)."""

    def __init__(self) -> None:
        self.flying: dict[str, Flight] = {}
        self.led = 0
        self.joined = 0

    async def join(self, key: str, ctx: RequestContext,
                   call: Callable[[RequestContext], Awaitable[Reply]]) -> Reply:
        """The reply for ``ctx``: of the call in flight for ``key``, or of ``call(ctx)``,
        started now. Raises what the call raised; CancelledError when this client left
        (the call goes on while another waits)."""
        flight = self.flying.get(key)
        if flight is None:
            flight = self.flying[key] = Flight(self, key, ctx, call)
            self.led += 1
        else:
            self.joined += 1
            flight.joined(ctx)
        flight.clients += 1
        try:
            reply = await asyncio.shield(flight.task)
        except BaseException:  # this client left, or the call failed: it has no reply
            flight.release(Outcome(False))
            raise
        return flight.reply_for(ctx, reply)

    def collector(self) -> Collector:
        return _Collector(self)


class Flight:
    """One upstream call and its clients (see the module docstring). ``clients``: requests
    still waiting for or reading its reply."""

    def __init__(self, flights: Flights, key: str, leader: RequestContext,
                 call: Callable[[RequestContext], Awaitable[Reply]]) -> None:
        self.flights = flights
        self.key = key
        self.leader = leader
        self.clients = 0
        self.pieces: list[bytes] = []  # a stream's bytes read so far
        self.ended = False  # no more pieces will come (read to the end, broken or cancelled)
        self.error: UpstreamError | None = None  # the stream broke
        self.delivered = False
        self._arrived = asyncio.Event()  # set (and replaced) when a piece arrives
        self._reply: Reply | None = None
        self._pump: asyncio.Task[None] | None = None
        self.task: asyncio.Task[Reply] = asyncio.get_running_loop().create_task(
            self._fly(call, leader))

    def joined(self, ctx: RequestContext) -> None:
        """``ctx``'s request shares this call: its log line and headers say so."""
        ctx.record.coalesced = "follower"
        ctx.response_headers.append((b"x-gateway-coalesced", b"1"))
        self.leader.record.coalesced = "leader"

    async def _fly(self, call: Callable[[RequestContext], Awaitable[Reply]],
                   ctx: RequestContext) -> Reply:
        try:
            reply = await call(ctx)
        except BaseException:
            self._land()
            raise
        self._reply = reply
        if reply.stream is None:
            self._land()  # complete: a request from now on makes its own call
        else:
            self.pieces.append(reply.stream.first)
            self._pump = asyncio.get_running_loop().create_task(self._read(reply))
        return reply

    async def _read(self, reply: Reply) -> None:
        """Read the upstream stream to its end (its tail too, so the connection is reused)."""
        assert reply.stream is not None
        try:
            async for piece in reply.stream.chunks:
                self.pieces.append(piece)
                self._wake()
        except UpstreamError as exc:
            self.error = exc
        finally:
            self.ended = True
            self._land()
            self._wake()

    def _wake(self) -> None:
        arrived, self._arrived = self._arrived, asyncio.Event()
        arrived.set()

    def _land(self) -> None:
        if self.flights.flying.get(self.key) is self:
            del self.flights.flying[self.key]

    def reply_for(self, ctx: RequestContext, reply: Reply) -> Reply:
        """This client's own reply: the same answer; closing it releases this client."""
        if ctx is not self.leader:
            _copy_answer(self.leader, ctx)
            ctx.lossy = True  # the leader's answer is the one the cache stores
        stream = reply.stream
        if stream is None:
            own = Reply(reply.status, reply.headers, reply.body, sse=reply.sse,
                        json=reply.json)
        else:
            own = Reply(reply.status, reply.headers, stream=_View(self),
                        hide_usage=reply.hide_usage)
        own.on_close(self.release)
        return own

    def release(self, outcome: Outcome) -> None:
        """One client is done (served, failed or gone); the last one ends the call."""
        self.delivered = self.delivered or outcome.delivered
        self.clients -= 1
        if self.clients > 0:
            return
        if not self.task.done():
            self._land()  # no one may join a call being cancelled
            self.task.cancel()  # nobody waits: the upstream call goes
            return
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
        reply = self._reply
        if reply is not None:
            reply.close(Outcome(self.delivered, self.error is not None))

    async def more(self) -> None:
        """Until the next piece arrives (or the stream ends)."""
        await self._arrived.wait()


class _View:
    """One client's reading of a flight's stream (the :class:`gateway.context.Stream`
    protocol): everything read so far as ``first``, then each new piece."""

    __slots__ = ("_flight", "_next", "chunks", "first")

    def __init__(self, flight: Flight) -> None:
        self._flight = flight
        self._next = len(flight.pieces)
        self.first = b"".join(flight.pieces)
        self.chunks: AsyncIterator[bytes] = self._pieces()

    async def _pieces(self) -> AsyncIterator[bytes]:
        flight = self._flight
        while True:
            if self._next < len(flight.pieces):
                self._next += 1
                yield flight.pieces[self._next - 1]
            elif flight.error is not None:
                raise flight.error
            elif flight.ended:
                return
            else:
                await flight.more()

    async def finish(self) -> None:
        """The flight reads the upstream's tail itself."""

    def close(self, failed: bool = False) -> None:
        """Nothing of its own to close: the client is released by its reply's closer
        (:meth:`Flight.release`)."""


def _copy_answer(leader: RequestContext, ctx: RequestContext) -> None:
    """What the upstream answered, into a follower's context (its log line)."""
    ctx.upstream, ctx.model_served = leader.upstream, leader.model_served
    ctx.upstream_started, ctx.upstream_ended = leader.upstream_started, leader.upstream_ended
    if leader.usage is not None:
        ctx.usage = leader.usage
    ctx.finish_reason = leader.finish_reason


class _Collector(Collector):
    def __init__(self, flights: Flights) -> None:
        self.flights = flights

    def collect(self) -> Any:
        family = CounterMetricFamily(
            "gateway_coalesced_requests", "Requests by their part in a coalesced upstream "
            "call: leader (made a call, shared or not), follower (served by another's call).",
            labels=["role"])
        family.add_metric(["leader"], self.flights.led)
        family.add_metric(["follower"], self.flights.joined)
        yield family
