"""The model endpoints (chat completions, completions, embeddings; Anthropic's messages) as
plain ASGI apps.

Each request: authenticate, read the body and parse it once (in the endpoint's API format,
:mod:`gateway.formats.apis`),
take the policy snapshot and its pipeline, build the :class:`~gateway.context.RequestContext`
and run the pipeline, then send its reply, all while a watcher cancels everything the
moment the client disconnects. Streams are forwarded event by event as they arrive; an
upstream failure mid-stream becomes an error event in the client's format and the stream
ends (never a fake ``[DONE]`` or ``message_stop``). Errors are in the client's format too.
One log line and one metrics observation per request, whatever happened: the record is
filled from the context once, at the end (:func:`_fill`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gateway.concurrency import Shed
from gateway.context import Headers, Outcome, Reply, RequestContext, RequestKind
from gateway.errors import GatewayError, UpstreamError
from gateway.formats.apis import OPENAI, RESPONSES, ApiFormat
from gateway.formats.usage import Usage
from gateway.http import content_length, read_body, restrict_betas, send_bytes
from gateway.models import model_not_found
from gateway.requestlog import RequestRecord
from gateway.state import Gateway
from gateway.types import Receive, Scope, Send
from llm_wire.asgi import ClientDisconnected

__all__ = ["ModelEndpoint", "request_id_of"]

log = structlog.get_logger("gateway.endpoint")

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def request_id_of(headers: Headers, make: Callable[[], str]) -> str:
    """The client's ``x-request-id`` (if sane), else ``make()``."""
    for k, v in headers:
        if k == b"x-request-id" and 0 < len(v) <= 128 and v.isascii():
            return v.decode()
    return make()


class ModelEndpoint:
    """ASGI app for one model endpoint; ``path`` is the upstream path (relative to an
    upstream of the same API), e.g. /chat/completions; ``route`` the gateway's own."""

    def __init__(self, gateway: Gateway, kind: RequestKind, path: str, api: ApiFormat = OPENAI,
                 route: str | None = None) -> None:
        self.gw = gateway
        self.kind: RequestKind = kind
        self.path = path
        self.api = api
        self.route = route or "/v1" + path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        headers: Headers = scope["headers"]
        first = dict(reversed(headers))  # each name's first value (ctx.header_first)
        rec = RequestRecord(request_id_of(headers, gw.request_ids)
                            if b"x-request-id" in first else gw.request_ids(), self.route)
        api = self.api
        if api is not OPENAI:
            rec.api = api.name
        trace = None if gw.tracing is None else gw.tracing.start(first, rec.started, self.route)
        extra: Headers = [(b"x-request-id", rec.request_id.encode())]
        sending = _Sending(send, rec, extra, api)
        gw.metrics.in_flight += 1
        drain = gw.drain
        # The loop given: on Python 3.11 finding the running loop costs a getpid() call.
        task = asyncio.current_task(gw.loop)
        assert task is not None
        drain.tasks.add(task)
        ctx: RequestContext | None = None
        try:
            if drain.draining:
                raise drain.error()
            rec.key_id = gw.auth.check(headers)
            if gw.auth.betas and rec.key_id in gw.auth.betas:  # the key's betas only
                headers = restrict_betas(headers, gw.auth.betas[rec.key_id])
            raw = await read_body(receive, gw.config.server.max_body_bytes,
                                  content_length(first.get(b"content-length")))
            body = api.parse_request(raw, self.kind)
            runtime = gw.runtime  # the policy snapshot and its pipeline, taken once
            rec.policy_version = runtime.policy.version
            model = body["model"]
            rec.model_requested, rec.stream = model, bool(body.get("stream"))
            route = gw.models.routes.get(model)
            if route is None and model not in runtime.pipeline.aliases:
                route = gw.models.family(model)  # a family by pattern (gateway.models)
                if route is None:
                    raise model_not_found(model)
            name = model if route is None else route.name
            ctx = RequestContext(self.kind, self.path, raw, body, headers, first, rec.key_id,
                                 rec.request_id, rec.stream, runtime.policy, rec, rec.started,
                                 name, name, route, extra, api)
            ctx.trace = trace
            if "prompt_cache_key" in body:  # the client's own: namespaced by its key
                gw.cache_keys.scope(ctx)
            if rec.stream:
                ctx.accepted = sending.accepted
            with gw.watches.watch(receive, task):
                keepalive = runtime.policy.streaming.keepalive_s if rec.stream else 0.0
                if api is RESPONSES:  # a conversation rebuilt before, the answer kept after
                    turn = await gw.responses.resolve(ctx)
                    reply = await sending.keeping_alive(runtime.pipeline(ctx), keepalive)
                    gw.responses.keep(turn, ctx, reply)
                elif keepalive:
                    reply = await sending.keeping_alive(runtime.pipeline(ctx), keepalive)
                else:
                    reply = await runtime.pipeline(ctx)
                if reply.stream is not None:
                    await sending.relay(reply, ctx)
                else:
                    await sending.whole(reply, ctx)
        except ClientDisconnected:
            if not sending.completed:  # once the answer is whole, leaving is no cancel
                rec.cancelled = True
                rec.status = 499  # nginx's "client closed request"
        except asyncio.CancelledError:
            if not drain.expired:
                raise
            task.uncancel()  # ended by the drain deadline (gateway.drain): say so
            await sending.abort(drain.error())
        except Shed as exc:  # no admission stage to turn it into a degraded answer
            rec.shed = exc.reason
            await sending.error(exc.overloaded())
        except GatewayError as exc:
            await sending.error(exc)
        except Exception:
            log.exception("unhandled_error", request_id=rec.request_id, route=self.route)
            await sending.error(GatewayError("internal gateway error"))
        finally:
            drain.tasks.discard(task)
            gw.metrics.in_flight -= 1
            if ctx is not None:
                _fill(rec, ctx)
            rec.finish()
            if trace is not None:
                trace.end(rec, ctx)
            gw.metrics.observe(rec)
            gw.logger.emit(rec)


def _fill(rec: RequestRecord, ctx: RequestContext) -> None:
    """The log line's fields that the context owns (only those set: the record's class
    defaults say the rest)."""
    if ctx.upstream is not None:
        rec.upstream = ctx.upstream
    if ctx.model_served is not None:
        rec.model_served = ctx.model_served
        route = ctx.route
        if route is not None and route.pattern is not None:  # never the client's id
            rec.model_label = route.metric_label(ctx.model_served)
    if ctx.upstream_started is not None:
        rec.upstream_started, rec.upstream_ended = ctx.upstream_started, ctx.upstream_ended
    if ctx.queue_ms:
        rec.queue_ms = ctx.queue_ms
    if ctx.retries:
        rec.retries = ctx.retries
    if ctx.ttft_ms is not None:
        rec.ttft_ms = ctx.ttft_ms
    if ctx.finish_reason is not None:
        rec.finish_reason = ctx.finish_reason
    usage = ctx.usage
    if usage is not None:
        rec.prompt_tokens, rec.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        rec.cached_tokens = rec.cache_read_tokens = usage.cached_tokens
        rec.cache_write_tokens = usage.cache_write_tokens


class _Sending:
    """Sends one request's reply (or error) to the client, and ends the reply."""

    __slots__ = ("api", "completed", "early", "extra", "rec", "send", "started", "streaming")

    def __init__(self, send: Send, rec: RequestRecord, extra: Headers, api: ApiFormat) -> None:
        self.send = send
        self.rec = rec
        self.extra = extra  # the context's response headers: the same list
        self.api = api
        self.started = False
        self.streaming = False  # a relayed stream is under way
        self.early = b""  # opening events sent by accepted(), ahead of the stream
        #: The whole answer was handed to the server (for a stream, its end event): the
        #: client leaving after that (or the server saying so) cancels nothing.
        self.completed = False

    async def keeping_alive(self, pipeline: Awaitable[Reply], every_s: float) -> Reply:
        """The pipeline's reply to a stream request; meanwhile, when ``every_s`` > 0 and
        nothing comes for that long, the stream's headers and then an SSE comment every
        ``every_s``, so that proxies and load balancers that cut idle connections keep this
        one through a long prefill or queue (the reply, or an error, follows as events).
        A timer, not a task: a reply that comes in time (nearly all) costs one timer."""
        if not every_s:
            return await pipeline
        loop = asyncio.get_running_loop()
        beats: list[asyncio.Task[None]] = []
        timer = loop.call_later(every_s, lambda: beats.append(
            loop.create_task(self._beat(every_s))))
        try:
            return await pipeline
        finally:
            timer.cancel()
            for beat in beats:  # stopped between two comments (or in one: already written)
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

    async def accepted(self, headers: Headers, head: bytes = b"") -> None:
        """An upstream accepted the stream: its head goes out now, not with the first event
        (a prefill or a queue away), and ``head``, the client's opening events where a
        translated stream makes them early (an Anthropic client's ``message_start``; once:
        the stream begins with them too, and :meth:`relay` skips them). What follows comes
        as events, an error too (issue 31: early bytes). Upstream errors before it are
        still answered with their status."""
        if not self.started:
            self.streaming = True
            self.rec.status = 200
            await self._start(200, _SSE_HEADERS + headers)
        if head and not self.early:
            self.early = head
            await self.send({"type": "http.response.body", "body": head, "more_body": True})

    async def _beat(self, every_s: float) -> None:
        """The headers (once, as :meth:`accepted` sends them), then a comment every
        ``every_s`` until cancelled."""
        while True:
            await self.accepted([])
            await self.send({"type": "http.response.body", "body": b": keepalive\n\n",
                             "more_body": True})
            await asyncio.sleep(every_s)

    async def whole(self, reply: Reply, ctx: RequestContext) -> None:
        """Send a complete reply (JSON, or a whole SSE stream)."""
        if self.streaming:  # headers already sent, keeping the stream alive: as events
            await self._late(reply, ctx)
            return
        delivered = False
        if ctx.trace is not None:
            ctx.trace.answered(reply.json if reply.json is not None else reply.body)
        try:
            self.rec.status = reply.status
            if reply.sse:
                _first_event(ctx)
                await self._start(reply.status, _SSE_HEADERS + reply.headers)
                await self.send({"type": "http.response.body", "body": reply.body})
            else:
                self.started = True
                await send_bytes(self.send, reply.status, reply.body, reply.headers + self.extra)
            delivered = reply.status == 200
        finally:
            reply.close(Outcome(delivered))

    async def _late(self, reply: Reply, ctx: RequestContext) -> None:
        """A whole reply to a stream already started (kept alive): its events, or an error
        event for an error answer; the stream ends."""
        delivered = False
        try:
            if reply.sse:
                _first_event(ctx)
                body = reply.body
                delivered = reply.status == 200
            else:
                obj: dict[str, Any] = reply.json if isinstance(reply.json, dict) else {}
                inner: dict[str, Any] = obj["error"] if isinstance(obj.get("error"),
                                                                     dict) else obj
                exc = UpstreamError(str(inner.get("message")
                                        or f"upstream answered {reply.status}"))
                kind, code = inner.get("type"), inner.get("code")
                exc.type = kind if isinstance(kind, str) else exc.type
                exc.code = code if isinstance(code, str) else exc.code
                self.rec.error_type, self.rec.error_code = self.api.error_type(exc), exc.code
                body = self.api.error_event(exc)
            await self.send({"type": "http.response.body", "body": body, "more_body": False})
            self.completed = True
        finally:
            reply.close(Outcome(delivered))

    async def error(self, exc: GatewayError) -> None:
        """Answer ``exc`` in the client's format (unless the reply has started: a stream
        kept alive ends with it as an error event)."""
        rec, api = self.rec, self.api
        rec.status, rec.error_code = api.error_status(exc), exc.code
        rec.error_type = api.error_type(exc)  # as the client reads it
        if self.streaming:
            rec.status = 200
            await self.send({"type": "http.response.body", "body": api.error_event(exc),
                             "more_body": False})
            return
        if not self.started:
            headers = [(b"content-type", b"application/json"), *self.extra]
            headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
            await send_bytes(self.send, rec.status, api.error_body(exc), headers)

    async def abort(self, exc: GatewayError) -> None:
        """End the reply with ``exc``: an error answer, or an error event ending a stream
        under way (a whole reply already started is left to close)."""
        if not self.started:
            await self.error(exc)
            return
        self.rec.error_type, self.rec.error_code = self.api.error_type(exc), exc.code
        if self.streaming:
            await self.send({"type": "http.response.body", "body": self.api.error_event(exc),
                             "more_body": False})

    async def _start(self, status: int, headers: Headers) -> None:
        if self.started:  # already sent, keeping the stream alive
            return
        self.started = True
        await self.send({"type": "http.response.start", "status": status,
                         "headers": headers + self.extra})

    async def relay(self, reply: Reply, ctx: RequestContext) -> None:
        """Forward an upstream stream event by event; an upstream failure midway becomes an
        error event that ends the stream. What the stream says (usage, finish reason) goes
        into the context. The reply's taps (the cache's and the response store's
        collectors) read each piece after it is sent, off the client's path."""
        stream, rec, send, taps = reply.stream, self.rec, self.send, reply.taps
        assert stream is not None
        observer = self.api.observer(reply.hide_usage)
        rec.status = 200
        if ctx.trace is not None:
            ctx.trace.answered(stream.first)
        failed = delivered = False  # failed: the upstream broke the stream
        try:
            self.streaming = True
            await self._start(200, _SSE_HEADERS + reply.headers)
            try:
                chunk, chunks = stream.first, stream.chunks
                while True:
                    out = observer.feed(chunk)
                    if observer.done:  # [DONE]: sent below, with the end of the body
                        break
                    if out:
                        if ctx.ttft_ms is None:
                            _first_event(ctx)
                        sent = out
                        if self.early:  # the stream's opening, sent ahead already
                            sent, self.early = out.removeprefix(self.early), b""
                        await send({"type": "http.response.body", "body": sent,
                                    "more_body": True})
                        for tap in taps:  # what the client has: noted once it has it
                            tap(out)
                        out = b""
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                out += observer.flush()
                if not (observer.done or observer.errored):
                    raise UpstreamError("the upstream ended the stream before its end event")
                failed = observer.errored
            except UpstreamError as exc:
                failed = True
                rec.error_type, rec.error_code = self.api.error_type(exc), exc.code
                out = observer.flush() + self.api.failure_event(observer, exc)
            finally:
                ctx.upstream_ended = time.perf_counter()
            ctx.finish_reason = observer.finish_reason
            usage = Usage.of(observer.usage)
            if usage is not None:
                ctx.usage = usage
            if observer.errored and rec.error_type is None:  # the upstream's error event
                rec.error_type = observer.error_type or "upstream_error"
            if out:
                _first_event(ctx)
            await send({"type": "http.response.body", "more_body": False,
                        "body": out.removeprefix(self.early) if self.early else out})
            if out:
                for tap in taps:
                    tap(out)
            self.completed = True
            delivered = not failed
            if observer.done:
                await stream.finish()
        finally:  # also when the client left (cancelled, a failed send)
            reply.close(Outcome(delivered, failed))


def _first_event(ctx: RequestContext) -> None:
    """Note the time to the first event sent (once)."""
    if ctx.ttft_ms is None:
        ctx.ttft_ms = round((time.perf_counter() - ctx.started) * 1000, 3)
