"""Any other ``/v1/*`` path: forwarded byte for byte to the passthrough upstream.

The gateway does not interpret these (files, batches, moderations, ...): method, query,
body and headers go through, minus hop-by-hop headers and with the upstream's key; the
response body streams back as it arrives. A client disconnect closes the upstream request.
Each request counts against its key's requests per minute, as model requests do
(:func:`gateway.stages.rate_limit.charge_request`).
"""

from __future__ import annotations

import time

import structlog

from gateway.endpoint import request_id_of
from gateway.errors import GatewayError, NoUpstreamAvailable
from gateway.http import forward_request_headers, forward_response_headers, read_body, send_error
from gateway.requestlog import RequestRecord
from gateway.stages.rate_limit import charge_request
from gateway.state import Gateway
from gateway.types import Receive, Scope, Send
from gateway.upstreams.base import UpstreamRequest
from llm_wire.asgi import ClientDisconnected, run_until_disconnect

__all__ = ["Passthrough"]

log = structlog.get_logger("gateway.passthrough")


class Passthrough:
    def __init__(self, gateway: Gateway):
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        headers = scope["headers"]
        rec = RequestRecord(request_id_of(headers, gw.request_ids), scope["path"])
        extra = [(b"x-request-id", rec.request_id.encode())]
        started = False
        try:
            rec.key_id = gw.auth.check(headers)
            limited, refusal = await charge_request(gw.rate_limiter, gw.policy, rec.key_id,
                                                    rec)
            extra += limited
            if refusal is not None:
                raise refusal
            body = await read_body(receive, gw.config.server.max_body_bytes)
            upstream = gw.passthrough_upstream()
            if upstream is None:
                raise NoUpstreamAvailable("no upstream is configured for pass-through paths")
            path = scope["path"].removeprefix("/v1")
            if scope.get("query_string"):
                path += "?" + scope["query_string"].decode("latin-1")
            request = UpstreamRequest(scope["method"], path, body,
                                      forward_request_headers(headers), False, rec.request_id)
            rec.upstream = upstream.name

            async def relay() -> None:
                nonlocal started
                rec.upstream_started = time.perf_counter()
                response = await upstream.stream(request)
                try:
                    rec.status = response.status
                    await send({"type": "http.response.start", "status": response.status,
                                "headers": forward_response_headers(response.headers) + extra})
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
        except GatewayError as exc:
            rec.status, rec.error_type, rec.error_code = exc.status, exc.type, exc.code
            if not started:
                await send_error(send, exc, extra)
            else:  # headers are out: all we can do is cut the body short
                raise
        finally:
            rec.finish()
            gw.metrics.observe(rec)
            gw.logger.emit(rec)
