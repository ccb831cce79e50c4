"""The provider interface: every upstream (hosted API or the local engine) is one of these.

Three calls: :meth:`Upstream.send` (whole response), :meth:`Upstream.stream` (status and
headers now, body as it arrives) and :meth:`Upstream.aclose`; :meth:`Upstream.start` for
upstreams that own a process. Implementations convert their
transport's errors at the boundary into :mod:`gateway.errors` types:

- :class:`~gateway.errors.UpstreamUnreachable`: no response started (connect refused or timed
  out, connection dropped before the status line). Always safe to retry.
- :class:`~gateway.errors.UpstreamTimeout`: the upstream went silent for longer than the read
  timeout. Not retried (the work may still be running upstream).
- :class:`~gateway.errors.UpstreamError`: the response broke off mid-body.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from gateway.service_time import ServiceRates

__all__ = ["ReadResponse", "Upstream", "UpstreamRequest", "UpstreamResponse", "WholeResponse",
           "json_headers"]

RawHeaders = Sequence[tuple[bytes, bytes]]


@dataclass(slots=True)
class UpstreamRequest:
    """One request to an upstream: ``path`` is relative to the upstream's base URL
    (e.g. ``/chat/completions``); ``headers`` are extra client headers to forward."""

    method: str
    path: str
    body: bytes
    headers: RawHeaders
    stream: bool = False
    request_id: str = ""


@dataclass(slots=True)
class WholeResponse:
    """A complete upstream response, as :meth:`Upstream.send` returns it: status, headers and
    the whole body."""

    status: int
    headers: RawHeaders
    body: bytes


class UpstreamResponse(abc.ABC):
    """A response whose status and headers have arrived and whose body has not."""

    status: int
    headers: RawHeaders

    @abc.abstractmethod
    def iter_chunks(self, idle_s: float = 0.0) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (chunk boundaries are the transport's); ``idle_s``:
        the idle timeout :meth:`watch_idle` will start, if any (s)."""

    @abc.abstractmethod
    def watch_idle(self, idle_s: float, on_stall: Callable[[], None]) -> None:
        """Once :meth:`iter_chunks` is read: from now on, ``idle_s`` (s) with no event but
        pings or comments arriving is a stall, ``on_stall()`` called and the chunks raising
        :class:`~gateway.errors.UpstreamStalled` (gateway.stream_watch)."""

    @abc.abstractmethod
    async def read(self) -> bytes:
        """The rest of the body."""

    def at_eof(self) -> bool:
        """Whether the whole body has arrived (False when unknown)."""
        return False

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the response; an unfinished one closes its connection, which tells the
        upstream to stop generating."""


class ReadResponse(UpstreamResponse):
    """A response already read whole (an error rewritten into the client's shape, a count
    a provider answers its own way), served from memory; ``headers`` as given
    (:func:`json_headers` for a rewritten JSON body)."""

    __slots__ = ("_body", "headers", "status")

    def __init__(self, status: int, headers: RawHeaders, body: bytes) -> None:
        self.status, self.headers, self._body = status, headers, body

    async def _chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    def iter_chunks(self, idle_s: float = 0.0) -> AsyncIterator[bytes]:
        return self._chunks()

    def watch_idle(self, idle_s: float, on_stall: Callable[[], None]) -> None:
        pass  # nothing more arrives

    async def read(self) -> bytes:
        return self._body

    def at_eof(self) -> bool:
        return True

    def close(self) -> None:
        pass


def json_headers(headers: RawHeaders, body: bytes) -> RawHeaders:
    """``headers`` for ``body``, a JSON body written in place of the upstream's: its type
    and length, the rest kept."""
    return [*((k, v) for k, v in headers if k.lower() not in (b"content-type",
                                                               b"content-length")),
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


class Upstream(abc.ABC):
    name: str
    #: The wire format it speaks: "openai" (Chat Completions) or "anthropic" (Messages).
    api: str = "openai"
    #: Its ``gen_ai.provider.name`` in traces (OpenTelemetry GenAI conventions: gateway.tracing).
    provider: str = "openai"
    #: It also serves OpenAI's Responses API (``/responses``) itself: a Responses request
    #: goes to it untranslated (``native_responses`` in its config).
    native_responses: bool = False
    #: Requests it serves at once at most, when it knows (the local engine: its batch within
    #: max_step_slowdown, reported once up, else max_num_seqs); admission matches it
    #: (gateway.concurrency.AdmissionPolicy.for_capacity), told of changes through
    #: :meth:`on_capacity`.
    capacity: int | None = None
    #: A started request may be cancelled for a cache hit found later (see
    #: gateway.stages.cache): free on the local engine; a hosted API may bill it (opt-in).
    cancel_on_late_hit: bool = False
    #: It continues a final assistant message given ``continue_final_message`` (the local
    #: engine does; other OpenAI-compatible servers when the policy names them).
    continues_final_message: bool = False

    @property
    def enabled(self) -> bool:
        """False when the upstream cannot be used (e.g. its API key variable is unset)."""
        return True

    @property
    def ready(self) -> bool:
        """False while the upstream cannot answer yet (e.g. the local engine is loading)."""
        return True

    async def start(self) -> None:
        """Called once when the gateway starts (the local engine spawns its process)."""

    def on_capacity(self, changed: Callable[[int | None, ServiceRates | None], None]) -> None:
        """Call ``changed(capacity, rates)`` whenever ``capacity`` or the measured rates
        (gateway.service_time; the local engine's) change (fixed here: none)."""

    @abc.abstractmethod
    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send ``request``; return once the status line and headers arrived."""

    async def send(self, request: UpstreamRequest) -> WholeResponse:
        """Send ``request`` and read the whole response."""
        response = await self.stream(request)
        try:
            body = await response.read()
        finally:
            response.close()
        return WholeResponse(response.status, response.headers, body)

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections."""
