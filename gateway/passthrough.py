"""``/v1/*`` paths the gateway does not interpret, forwarded to an upstream that allows them.

Only paths an upstream's allow-list names pass (``upstreams.NAME.passthrough``, patterns
of :class:`gateway.paths.Pattern`; by default the provider's stateless endpoints,
:data:`gateway.paths.DEFAULT_PASSTHROUGH`); the first enabled upstream, in config order,
whose list matches serves the path; any other path is a 404 (in the caller's format) and
is never forwarded. The path is the request's canonical one (:mod:`gateway.paths`, resolved at the
door): its segments, each percent-encoded as one segment, are joined under the upstream's
base URL (``/v1/audio/speech`` -> ``{base_url}/audio/speech``), so no request can reach a
path outside it; the query string goes along and cannot change the path.

Method, query and body go through as they are; of the client's headers, only those the
upstream allows (gateway.http.HeaderAllow), with the upstream's key; the answer streams
back as it arrives. A client disconnect closes the upstream request. The gateway's own
errors (401, 404, 429...) are in the caller's API (:mod:`gateway.unserved`: Anthropic's
for a request with ``anthropic-version``). Each request counts against its key's requests
and tokens per minute (its body's bytes / 4, never settled:
:func:`gateway.stages.rate_limit.charge_request`). A stateful path an operator allows
(files, batches...) is checked, with gateway keys configured, by
:class:`gateway.ownership.Ownership`: each key reaches only the objects it created.
"""

from __future__ import annotations

import time
from urllib.parse import quote

from gateway.config import Config
from gateway.endpoint import request_id_of
from gateway.errors import GatewayError, NotFound, NoUpstreamAvailable, UpstreamError
from gateway.http import (
    forward_request_headers,
    forward_response_headers,
    read_body,
    restrict_betas,
    send_bytes,
)
from gateway.metric_labels import PASSTHROUGH
from gateway.ownership import MAX_ANSWER_BYTES, Ownership
from gateway.paths import Pattern, encode_segments, segments_of
from gateway.requestlog import RequestRecord
from gateway.stages.rate_limit import charge_request
from gateway.state import Gateway
from gateway.types import Receive, Scope, Send
from gateway.unserved import anthropic_caller, error_answer, note_error
from gateway.upstreams.base import Upstream, UpstreamRequest, UpstreamResponse
from llm_wire.asgi import ClientDisconnected, run_until_disconnect

__all__ = ["Passthrough", "allow_lists"]

#: The bytes a query string keeps as they are (RFC 3986's query characters, and escapes);
#: any other byte is percent-encoded.
_QUERY_SAFE = "!$&'()*+,;=:@/?%-._~"


def allow_lists(config: Config) -> list[tuple[str, list[Pattern]]]:
    """Each upstream's pass-through patterns, in config order (those with none left out)."""
    return [(name, [Pattern(p) for p in up.passthrough or ()])
            for name, up in config.upstreams.items() if up.passthrough]


class Passthrough:
    def __init__(self, gateway: Gateway):
        self.gw = gateway
        self.allowed = allow_lists(gateway.config)
        #: The ids each key created, for stateful paths (kept across policy reloads).
        self.ownership = Ownership()

    def upstream_for(self, segments: list[str]) -> Upstream | None:
        """The first enabled upstream whose allow-list matches; None when none does.
        Raises NoUpstreamAvailable (503) when only disabled ones do."""
        matched = False
        for name, patterns in self.allowed:
            upstream = self.gw.upstreams.get(name)
            if upstream is not None and any(p.matches(segments) for p in patterns):
                if upstream.enabled:
                    return upstream
                matched = True
        if matched:
            raise NoUpstreamAvailable("no upstream serving this path is available")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        headers = scope["headers"]
        path, method = scope["path"], scope["method"]
        rec = RequestRecord(request_id_of(headers, gw.request_ids), PASSTHROUGH)
        rec.path = path[:256]
        extra = [(b"x-request-id", rec.request_id.encode())]
        started = refused = False
        try:
            rec.key_id = gw.auth.check(headers)
            segments = segments_of(path)
            upstream = self.upstream_for(segments)
            if upstream is None:
                refused = True
                raise NotFound(f"{method} {path[:256]} is not served by this gateway")
            betas = gw.auth.betas.get(rec.key_id) if rec.key_id is not None else None
            if betas is not None:
                headers = restrict_betas(headers, betas)
            body = await read_body(receive, gw.config.server.max_body_bytes)
            limited, refusal = await charge_request(gw.rate_limiter, gw.policy, rec.key_id,
                                                    rec, tokens=len(body) // 4)
            extra += limited
            if refusal is not None:
                raise refusal
            exchange = None
            if rec.key_id is not None:  # gateway keys: tenants share the upstream's key
                content_type = next((v for k, v in headers if k == b"content-type"), b"")
                exchange = self.ownership.exchange(upstream.name, rec.key_id, method,
                                                   segments[1:], body, content_type)
            target = encode_segments(segments[1:])
            if scope.get("query_string"):
                target += "?" + quote(scope["query_string"], safe=_QUERY_SAFE)
            request = UpstreamRequest(method, target, body, forward_request_headers(headers),
                                      False, rec.request_id)
            rec.upstream = upstream.name

            async def relay() -> None:
                nonlocal started
                rec.upstream_started = time.perf_counter()
                response = await upstream.stream(request)
                try:
                    rec.status = response.status
                    out = forward_response_headers(response.headers) + extra
                    if exchange is not None and exchange.read:
                        answer = exchange.answer(response.status, await _whole(response))
                        started = True
                        await send_bytes(send, response.status, answer, out)
                        return
                    if exchange is not None:
                        exchange.answer(response.status, b"")
                    await send({"type": "http.response.start", "status": response.status,
                                "headers": out})
                    started = True
                    async for chunk in response.iter_chunks():
                        await send({"type": "http.response.body", "body": chunk,
                                    "more_body": True})
                finally:
                    rec.upstream_ended = time.perf_counter()
                    response.close()
                await send({"type": "http.response.body", "body": b""})

            await run_until_disconnect(receive, relay())
        except ClientDisconnected:
            rec.cancelled, rec.status = True, 499
        except GatewayError as exc:  # the gateway's own: in the caller's API (an Anthropic
            caller = anthropic_caller(path, headers)  # client's, by its anthropic-version)
            note_error(rec, exc, caller)
            if not started:
                status, body = error_answer(exc, caller)
                await send_bytes(send, status, body, [
                    (b"content-type", b"application/json"), *extra,
                    *((k.lower().encode(), v.encode()) for k, v in exc.headers.items())])
            else:  # headers are out: all we can do is cut the body short
                raise
        finally:
            rec.finish()
            if refused:  # a path no upstream allows: no series of its own
                gw.metrics.refuse("not_found")
            else:
                gw.metrics.observe(rec)
            gw.logger.emit(rec)


async def _whole(response: UpstreamResponse) -> bytes:
    """The answer's body, to be read before it is sent on (at most MAX_ANSWER_BYTES)."""
    chunks, size = [], 0
    async for chunk in response.iter_chunks():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise UpstreamError("the upstream's answer is too large to check")
        chunks.append(chunk)
    return b"".join(chunks)

