"""The model endpoints (chat completions, completions, embeddings) as plain ASGI apps.

Each request: authenticate, read and check the body once, resolve the model, then dispatch
to its targets (retries and fallback, see :mod:`gateway.dispatch`) while a watcher cancels
everything the moment the client disconnects. Streams are forwarded event by event as they
arrive; an upstream failure mid-stream becomes an OpenAI error event and the stream ends
(never a fake ``[DONE]``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog

from gateway.admission import PRIORITY_RANK, AdmissionPolicy, Shed
from gateway.cache.answer import StreamCollector, answer_from_json, hit_body, hit_events
from gateway.cache.stage import Lookup
from gateway.config import Target
from gateway.degraded import serve_or_degrade
from gateway.dispatch import Opened, Ticket
from gateway.errors import GatewayError, NoUpstreamAvailable, UpstreamError, UpstreamTimeout
from gateway.http import (
    ClientDisconnected,
    forward_request_headers,
    forward_response_headers,
    read_body,
    run_until_disconnect,
    send_bytes,
    send_error,
)
from gateway.policy import RouterPolicy
from gateway.requestlog import RequestRecord
from gateway.routing.stage import Decision
from gateway.sse import StreamObserver, error_event
from gateway.state import Gateway, ModelRoute
from gateway.types import Receive, Scope, Send
from gateway.upstreams.base import Reply, UpstreamRequest
from gateway.validate import Kind, parse_body

__all__ = ["ModelEndpoint", "request_id_of"]

log = structlog.get_logger("gateway.proxy")

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def request_id_of(headers: list[tuple[bytes, bytes]], make: Callable[[], str]) -> str:
    """The client's ``x-request-id`` (if sane), else ``make()``."""
    for k, v in headers:
        if k == b"x-request-id" and 0 < len(v) <= 128 and v.isascii():
            return v.decode()
    return make()


class ModelEndpoint:
    """ASGI app for one model endpoint; ``path`` is the upstream path, e.g. /chat/completions."""

    def __init__(self, gateway: Gateway, kind: Kind, path: str):
        self.gw = gateway
        self.kind = kind
        self.path = path
        self.route = "/v1" + path
        self.ids = gateway.request_ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        rec = RequestRecord(request_id_of(headers, self.ids), self.route)
        extra = [(b"x-request-id", rec.request_id.encode())]
        state = {"started": False}
        entered = False
        gw.metrics.in_flight += 1
        try:
            rec.key_id = gw.auth.check(headers)
            body = await read_body(receive, gw.config.server.max_body_bytes,
                                   _content_length(headers))
            data = parse_body(body, self.kind)
            rec.model_requested = data["model"]
            rec.stream = bool(data.get("stream"))
            policy = gw.policy
            routed = policy.routing.router_for(data["model"]) if self.kind == "chat" else None
            route: ModelRoute | Decision
            if routed is None:
                route = gw.models.resolve(data["model"])
                cache_scope = route.name
            else:
                cache_scope = routed[0]  # the router's name: its answers share one scope
            lookup: Lookup | None = None
            if self.kind == "chat" and gw.cache is not None and policy.cache.enabled:
                lookup = await gw.cache.lookup(data, headers, cache_scope, rec.key_id,
                                               policy.cache, rec)
                if lookup.hit is not None:
                    await _send_hit(lookup, data, rec, extra, send)
                    return
                extra.append((b"x-cache", (rec.cache or "bypass").encode()))
            if routed is not None:
                route = await self._decide(routed[0], routed[1], data, lookup, rec, extra)
            gw.limits.enter(policy.admission, rec.key_id, gw.metrics.in_flight,
                            policy.degraded.min_retry_after_s)
            entered = True
            ticket = _ticket(policy.admission, rec.key_id, headers, len(body))

            async def serve_model(model: ModelRoute, fallback: bool) -> None:
                limiter = gw.dispatcher.model_limiter(model.name, policy.admission)
                slot = await limiter.acquire(ticket.priority, ticket.long) if limiter else None
                try:
                    if rec.stream:
                        await self._stream(data, body, model.targets, headers, rec, extra, send,
                                           state, ticket, lookup, fallback)
                    else:
                        await self._unary(data, body, model.targets, headers, rec, extra, send,
                                          ticket, lookup, fallback)
                except (UpstreamError, NoUpstreamAvailable) as exc:
                    if fallback and not state["started"] and not isinstance(exc, UpstreamTimeout):
                        raise _TierFailed(exc.code) from exc
                    raise
                finally:
                    if slot is not None:
                        slot.release()

            async def serve(model: ModelRoute | Decision) -> None:
                if isinstance(model, ModelRoute):
                    await serve_model(model, False)
                else:
                    await self._serve_chain(model, serve_model, rec, extra)

            reroute = gw.models.routes.get(policy.degraded.reroute_model or "")
            async def from_cache(label: str) -> bool:
                if lookup is None or gw.cache is None:
                    return False
                lookup.hit = gw.cache.choose(lookup, policy.cache.relaxed)
                if lookup.hit is None:
                    return False
                rec.cache, rec.cache_layer = "hit", "semantic"
                extra[:] = [h for h in extra if h[0] != b"x-cache"]
                extra.append((b"x-gateway-degraded", label.encode()))
                await _send_hit(lookup, data, rec, extra, send)
                return True

            work = serve_or_degrade(serve, route, reroute if reroute is not route else None,
                                    policy.degraded, rec, extra, from_cache)
            await run_until_disconnect(receive, work)
        except ClientDisconnected:
            rec.cancelled = True
            rec.status = 499  # nginx's "client closed request"
        except GatewayError as exc:
            rec.status, rec.error_type, rec.error_code = exc.status, exc.type, exc.code
            if not state["started"]:
                await send_error(send, exc, extra)
        except Exception:
            log.exception("unhandled_error", request_id=rec.request_id, route=self.route)
            rec.status, rec.error_type, rec.error_code = 500, "server_error", "internal_error"
            if not state["started"]:
                await send_error(send, GatewayError("internal gateway error"), extra)
        finally:
            gw.metrics.in_flight -= 1
            if entered:
                gw.limits.leave(rec.key_id)
            rec.finish()
            gw.metrics.observe(rec)
            gw.logger.emit(rec)

    async def _decide(self, name: str, router: RouterPolicy, data: dict[str, Any],
                      lookup: Lookup | None, rec: RequestRecord,
                      extra: list[tuple[bytes, bytes]]) -> Decision:
        """Choose the tier; the decision goes into the log line and the response headers."""
        started = time.perf_counter()
        known: tuple[str | None, Any] = (None, None)
        if lookup is not None and lookup.key is not None:  # what the cache embedded
            known = (lookup.key.query, lookup.vector)
        decision = await self.gw.routing.decide(name, router, self.gw.policy.routing.tiers,
                                                data, known)
        rec.route_ms = round((time.perf_counter() - started) * 1000, 3)
        rec.router, rec.route_tier = name, decision.tier
        rec.route_threshold = round(decision.threshold, 4)
        extra.append((b"x-route-tier", decision.tier.encode()))
        if decision.score is not None:
            rec.route_score = round(decision.score, 4)
            extra.append((b"x-route-score", f"{decision.score:.4f}".encode()))
        return decision

    async def _serve_chain(
        self, decision: Decision,
        serve_model: Callable[[ModelRoute, bool], Awaitable[None]],
        rec: RequestRecord, extra: list[tuple[bytes, bytes]],
    ) -> None:
        """Try the decision's models in order: on a failure (5xx, 429, unreachable, prompt
        too long for its context) or shedding, the next one; the last one's answer, whatever it is, goes to the client.
        Raises Shed when every model shed."""
        shed: Shed | None = None
        last = len(decision.chain) - 1
        for i, (tier, name) in enumerate(decision.chain):
            model = self.gw.models.routes[name]  # the policy was checked against them
            if tier != decision.tier and rec.route_fallback != tier:
                rec.route_fallback = tier
                extra.append((b"x-route-fallback", tier.encode()))
            try:
                await serve_model(model, i < last)
                return
            except Shed as exc:
                shed = exc
            except _TierFailed as exc:
                log.info("route_fallback", request_id=rec.request_id, tier=tier, model=name,
                         reason=exc.reason)
        if shed is None:
            raise NoUpstreamAvailable("no model of the routed tiers is available")
        raise shed

    def _builder(
        self, data: dict[str, Any], raw: bytes, client_headers: list[tuple[bytes, bytes]],
        rec: RequestRecord, changed: bool,
    ) -> Any:
        forwarded = forward_request_headers(client_headers)

        def build(target: Target) -> UpstreamRequest:
            if target.model != data["model"] or changed:
                body = orjson.dumps({**data, "model": target.model})
            else:
                body = raw
            return UpstreamRequest("POST", self.path, body, forwarded, rec.stream, rec.request_id)

        return build

    async def _unary(
        self, data: dict[str, Any], raw: bytes, targets: tuple[Target, ...],
        headers: list[tuple[bytes, bytes]], rec: RequestRecord,
        extra: list[tuple[bytes, bytes]], send: Send, ticket: Ticket,
        lookup: Lookup | None = None, fallback: bool = False,
    ) -> None:
        build = self._builder(data, raw, headers, rec, changed=False)
        _, reply = await self.gw.dispatcher.unary(targets, build, self.gw.policy, rec, ticket)
        rec.upstream_ended = time.perf_counter()
        if fallback and _failed(reply):
            raise _TierFailed(f"status {reply.status}")
        _observe_reply(reply, rec)
        await send_bytes(send, reply.status, reply.body,
                         forward_response_headers(reply.headers) + extra)
        if lookup is not None and lookup.store and reply.status == 200 and self.gw.cache:
            cache_policy = self.gw.policy.cache
            self.gw.cache.store_later(
                lookup, answer_from_json(reply.body, cache_policy.cache_tool_calls),
                cache_policy)

    async def _stream(
        self, data: dict[str, Any], raw: bytes, targets: tuple[Target, ...],
        headers: list[tuple[bytes, bytes]], rec: RequestRecord,
        extra: list[tuple[bytes, bytes]], send: Send, state: dict[str, bool], ticket: Ticket,
        lookup: Lookup | None = None, fallback: bool = False,
    ) -> None:
        policy = self.gw.policy
        options = data.get("stream_options") or {}
        hide_usage = policy.streaming.observe_usage and not options.get("include_usage")
        if hide_usage:
            data = {**data, "stream_options": {**options, "include_usage": True}}
        build = self._builder(data, raw, headers, rec, changed=hide_usage)
        _, opened = await self.gw.dispatcher.stream(targets, build, policy, rec, ticket)
        if isinstance(opened, Reply):  # the upstream refused with a status: pass it on
            rec.upstream_ended = time.perf_counter()
            if fallback and _failed(opened):
                raise _TierFailed(f"status {opened.status}")
            _observe_reply(opened, rec)
            await send_bytes(send, opened.status, opened.body,
                             forward_response_headers(opened.headers) + extra)
            return
        cache = self.gw.cache
        storing = cache is not None and lookup is not None and lookup.store
        collector = StreamCollector() if storing else None
        await self._relay(opened, rec, extra, send, state, hide_usage, collector)
        if collector is not None and rec.error_type is None:
            assert cache is not None and lookup is not None  # storing
            usage = {"prompt_tokens": rec.prompt_tokens,
                     "completion_tokens": rec.completion_tokens}
            cache.store_later(lookup, collector.answer(rec.finish_reason, usage), policy.cache)

    async def _relay(
        self, opened: Opened, rec: RequestRecord, extra: list[tuple[bytes, bytes]],
        send: Send, state: dict[str, bool], hide_usage: bool,
        collector: StreamCollector | None = None,
    ) -> None:
        observer = StreamObserver(hide_usage_chunk=hide_usage)
        rec.status = 200
        start_headers = _SSE_HEADERS + [
            h for h in forward_response_headers(opened.response.headers)
            if h[0] not in (b"content-type", b"cache-control")
        ] + extra
        try:
            failed = True  # unless it ends well or the client leaves
            try:
                await send({"type": "http.response.start", "status": 200,
                            "headers": start_headers})
                state["started"] = True
                out = observer.feed(opened.first)
                chunks = opened.chunks
                while True:
                    if out:
                        rec.mark_first_event()
                        if collector is not None:
                            collector.feed(out)
                        await send({"type": "http.response.body", "body": out,
                                    "more_body": True})
                    chunk = await anext(chunks, None)
                    if chunk is None:
                        break
                    out = observer.feed(chunk)
                out = observer.flush()
                failed = not observer.done or observer.errored
            except BaseException as exc:  # else the client left (cancelled, a failed send)
                failed = isinstance(exc, UpstreamError)
                raise
            finally:
                rec.upstream_ended = time.perf_counter()
                opened.close(failed)
            if collector is not None:
                collector.feed(out)
            if not (observer.done or observer.errored):
                raise UpstreamError("the upstream ended the stream without [DONE]")
        except UpstreamError as exc:
            rec.error_type, rec.error_code = exc.type, exc.code
            out = observer.flush() + error_event(exc.as_dict())
        rec.finish_reason = observer.finish_reason
        rec.take_usage(observer.usage)
        if observer.errored and rec.error_type is None:
            rec.error_type = "upstream_error"
        await send({"type": "http.response.body", "body": out, "more_body": False})


async def _send_hit(lookup: Lookup, data: dict[str, Any], rec: RequestRecord,
                    extra: list[tuple[bytes, bytes]], send: Send) -> None:
    """Serve a cache hit: chat.completion JSON, or an SSE stream when the client streams."""
    assert lookup.hit is not None
    stored = lookup.hit.answer
    headers = [(b"x-cache", b"hit")]
    if rec.similarity is not None and rec.cache_layer == "semantic":
        headers.append((b"x-cache-similarity", f"{rec.similarity:.4f}".encode()))
    headers += extra
    answer = orjson.loads(stored)
    rec.status, rec.model_served = 200, answer.get("model")
    rec.finish_reason = answer.get("finish_reason")
    rec.prompt_tokens = answer.get("prompt_tokens")
    rec.completion_tokens = answer.get("completion_tokens")
    if rec.stream:
        options = data.get("stream_options") or {}
        body = hit_events(stored, bool(options.get("include_usage")))
        rec.mark_first_event()
        await send({"type": "http.response.start", "status": 200,
                    "headers": _SSE_HEADERS + headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    else:
        await send_bytes(send, 200, hit_body(stored),
                         [(b"content-type", b"application/json")] + headers)


class _TierFailed(Exception):
    """A routed model failed before any byte reached the client: try the next one."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _failed(reply: Reply) -> bool:
    """Worth the next routed tier: 5xx, 429, or a prompt too long for this model's context
    (the other tier may have a longer one)."""
    if reply.status >= 500 or reply.status == 429:
        return True
    if reply.status == 400 and b"context_length_exceeded" in reply.body:
        try:
            error = orjson.loads(reply.body).get("error")
        except (orjson.JSONDecodeError, AttributeError):
            return False
        return isinstance(error, dict) and error.get("code") == "context_length_exceeded"
    return False


def _observe_reply(reply: Reply, rec: RequestRecord) -> None:
    rec.status = reply.status
    try:
        obj = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        if reply.status >= 400:
            rec.error_type = "upstream_error"
        return
    if reply.status >= 400:
        error = obj.get("error")
        rec.error_type = error.get("type") if isinstance(error, dict) else "upstream_error"
        rec.error_code = error.get("code") if isinstance(error, dict) else None
        return
    usage = obj.get("usage")
    if isinstance(usage, dict):
        rec.take_usage(usage)
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[-1], dict):
        rec.finish_reason = choices[-1].get("finish_reason")


def _ticket(policy: AdmissionPolicy, key_id: str | None, headers: list[tuple[bytes, bytes]],
            size: int) -> Ticket:
    priority = policy.key_priority.get(key_id, "") if key_id else ""
    if not priority:
        for k, v in headers:
            if k == b"x-gateway-priority":
                priority = v.decode("latin-1").strip().lower()
        if priority not in PRIORITY_RANK:
            priority = "normal"
    return Ticket(priority, size > policy.long_prompt_bytes)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for k, v in headers:
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None
