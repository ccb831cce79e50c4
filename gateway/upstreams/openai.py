"""Upstream ``type = "openai"``: any OpenAI-compatible HTTP API (OpenAI, vLLM, the local engine).

Requests are forwarded as they are (the gateway has already rewritten ``model``); the
client's key is replaced by the upstream's, and of the client's headers only those its
allow-list names go (gateway.http.HeaderAllow: issue 45, finding 8). Transport: aiohttp, with one keep-alive pool per
upstream. (Measured on the fake upstream, 2 cores: httpx 496 req/s, httpx over the
httpx-aiohttp transport 2,412 req/s, aiohttp 7,219 req/s at concurrency 32.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp
from yarl import URL

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamError, UpstreamStalled, UpstreamTimeout, UpstreamUnreachable
from gateway.http import HeaderAllow
from gateway.stream_events import alive
from gateway.tracing import OUTGOING
from gateway.upstreams.base import RawHeaders, Upstream, UpstreamRequest, UpstreamResponse

__all__ = ["OpenAIUpstream"]


class _Chunks:
    """A body as it arrives, one ``readany()`` a step, transport errors converted. (A class,
    not an async generator around ``iter_any()``: one layer less on every streamed chunk.)

    The read timeout (``timeout_s`` of silence) is watched here, not by aiohttp's
    ``sock_read``, which cancels and makes a timer on every read from the socket (~6k
    instructions, about two reads a streamed event): one timer for the body, moved only
    when it fires. It fires ``timeout_s`` after the last chunk taken; the body has timed out
    when nothing arrived since that chunk (bytes that arrived but wait to be taken are no
    silence: aiohttp too stops its timer while the reader lags).

    Once :meth:`watch_idle` is called (the answer streams: gateway.stream_watch), the same
    timer also watches for a stall: ``idle_s`` since the last chunk taken that held more
    than pings and comments (``gateway.stream_events.alive``), nothing waiting to be taken,
    and the chunks raise :class:`~gateway.errors.UpstreamStalled`."""

    __slots__ = ("_alive", "_content", "_idle_s", "_last", "_loop", "_name", "_on_stall",
                 "_stalled", "_taken", "_timeout_s", "_timer")

    def __init__(self, content: aiohttp.StreamReader, name: str, timeout_s: float,
                 idle_s: float = 0.0) -> None:
        self._content = content
        self._name = name
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._last = self._alive = self._loop.time()
        self._taken = content.total_bytes
        self._idle_s = 0.0
        self._on_stall: Callable[[], None] | None = None
        self._stalled = False
        # set for the idle timeout to come where it is the shorter (no timer moved when
        # watch_idle starts it; before that, firing early only sets it again)
        first = min(timeout_s, idle_s) if idle_s else timeout_s
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(
            self._last + first, self._check)

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._content.readany()
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            if self._stalled:
                raise UpstreamStalled(f"upstream {self._name!r} stalled: no event for "
                                      f"{self._idle_s * 1000:.0f} ms", reason="idle") from exc
            raise UpstreamTimeout(f"upstream {self._name!r} went silent mid-response") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"upstream {self._name!r} broke off mid-response") from exc
        if not chunk:
            self.stop()
            raise StopAsyncIteration
        now = self._last = self._loop.time()
        self._taken += len(chunk)
        if self._idle_s:
            # pings and comments are no sign of an answer: a chunk opening with neither
            # ":" nor "event: ping" (OpenAI's "data: ...", Anthropic's other events) is one
            # at the cost of an index and a slice
            first = chunk[0]
            if first != 58 and (first != 101 or chunk[:11] != b"event: ping") or alive(chunk):
                self._alive = now
        return chunk

    def watch_idle(self, idle_s: float, on_stall: Callable[[], None]) -> None:
        """From now on, ``idle_s`` (s, > 0) without an event but pings or comments is a
        stall: ``on_stall()`` is called and the next read raises UpstreamStalled."""
        self._idle_s, self._on_stall = idle_s, on_stall
        self._alive = self._loop.time()
        timer = self._timer
        if timer is not None and self._alive + idle_s < timer.when():
            timer.cancel()  # (only where the read timeout is the longer)
            self._timer = self._loop.call_at(self._alive + idle_s, self._check)

    def _due(self) -> float:
        due = self._last + self._timeout_s
        return min(due, self._alive + self._idle_s) if self._idle_s else due

    def _check(self) -> None:
        now = self._loop.time()
        if now < self._due():  # a chunk was taken since it was set
            self._timer = self._loop.call_at(self._due(), self._check)
        elif self._content.total_bytes > self._taken:  # arrived, not taken yet: no silence
            self._timer = self._loop.call_at(now + min(self._timeout_s, self._idle_s
                                                       or self._timeout_s), self._check)
        else:
            self._timer = None
            if self._idle_s and now >= self._alive + self._idle_s:
                self._stalled = True
                if self._on_stall is not None:
                    self._on_stall()
            self._content.set_exception(
                aiohttp.ServerTimeoutError("Timeout on reading data from socket"))

    def stop(self) -> None:
        """The body is over (read to its end, or closed): no more watching."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _AiohttpResponse(UpstreamResponse):
    __slots__ = ("_chunks", "_name", "_resp", "_timeout_s", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, name: str, timeout_s: float):
        self._resp = resp
        self._name = name
        self._timeout_s = timeout_s
        self._chunks: _Chunks | None = None
        self.status = resp.status
        self.headers = resp.raw_headers

    def iter_chunks(self, idle_s: float = 0.0) -> AsyncIterator[bytes]:
        # The body's read timeout is the chunks' from here on (see _Chunks).
        connection = self._resp.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = None
        self._chunks = _Chunks(self._resp.content, self._name, self._timeout_s, idle_s)
        return self._chunks

    def watch_idle(self, idle_s: float, on_stall: Callable[[], None]) -> None:
        if self._chunks is not None:
            self._chunks.watch_idle(idle_s, on_stall)

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout(f"upstream {self._name!r} went silent mid-response") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"upstream {self._name!r} broke off mid-response") from exc

    def at_eof(self) -> bool:
        return self._resp.content.is_eof()

    def close(self) -> None:
        if self._chunks is not None:
            self._chunks.stop()
        # release() returns a finished connection to the pool; close() drops an unfinished
        # one, which is how the upstream learns the client is gone.
        if self._resp.content.is_eof():
            self._resp.release()
        else:
            self._resp.close()


class OpenAIUpstream(Upstream):
    api = "openai"
    #: The header its key (``api_key_env``) is sent in, after ``key_prefix``.
    key_header = "authorization"
    key_prefix = "Bearer "

    def __init__(self, name: str, config: UpstreamConfig):
        self.name = name
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self._headers: dict[str, str] = {"accept-encoding": "identity", **config.headers}
        #: The client headers it sends on (gateway.http.FORWARDED and its forward_headers).
        self._forward = HeaderAllow(config.forward_headers)
        key = config.api_key
        if key:
            self._headers[self.key_header] = self.key_prefix + key
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=config.connect_timeout_ms / 1000,
            sock_read=config.read_timeout_s,
        )
        self._session: aiohttp.ClientSession | None = None
        # Read once, like the key itself (asked on every request: no environment lookup).
        self._enabled = config.enabled
        self.cancel_on_late_hit = bool(config.cancel_on_late_hit)
        self.native_responses = config.native_responses

    @property
    def enabled(self) -> bool:
        return self._enabled

    def _get_session(self) -> aiohttp.ClientSession:
        # Created lazily: a ClientSession must be made inside the running event loop.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.config.max_connections, keepalive_timeout=30, ttl_dns_cache=300
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # Never keep upstream cookies: they would be replayed for other clients.
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    def stream(self, request: UpstreamRequest) -> Coroutine[Any, Any, UpstreamResponse]:
        # _open's coroutine returned, not awaited: no frame of its own on every request
        return self._open(request.method, self.base_url + request.path, request.body,
                          self._merge(request.headers, request.request_id))

    async def _open(self, method: str, url: str | URL, body: bytes, headers: dict[str, str]
                    ) -> UpstreamResponse:
        """Send one request as it is (``url``: a yarl URL is sent without requoting, as a
        signed path must be); transport errors converted."""
        session = self._get_session()
        try:
            resp = await session.request(
                method,
                url,
                data=body or None,
                headers=headers,
                allow_redirects=False,
                compress=False,
            )
        except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as exc:
            raise UpstreamUnreachable(f"upstream {self.name!r} is unreachable") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise UpstreamUnreachable(f"upstream {self.name!r} dropped the connection") from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout(f"upstream {self.name!r} did not answer in time") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"upstream {self.name!r} failed: {type(exc).__name__}") from exc
        return _AiohttpResponse(resp, self.name, self.config.read_timeout_s)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _merge(self, client: RawHeaders, request_id: str) -> dict[str, str]:
        """The request's headers: the client's that this upstream forwards (its
        HeaderAllow), then ours (which win)."""
        own = self._headers
        out = own.copy()
        names, prefixes = self._forward.names, self._forward.prefixes
        for k, v in client:
            if k in names or (prefixes and k.startswith(prefixes)):
                out[k.decode("latin-1")] = v.decode("latin-1")
        out.update(own)
        if request_id:
            out["x-request-id"] = request_id
        traced = OUTGOING.get()  # this attempt's trace context, when traced (not the client's)
        if traced is not None:
            out.pop("tracestate", None)
            out.update(traced)
        return out

