"""The caller's API for answers no model endpoint gives: a path the gateway does not serve, a
method a path does not take, a pass-through refused, a probe of the base URL.

An Anthropic client is one that calls ``/v1/messages`` or below, or any path with the
``anthropic-version`` header (the anthropic SDKs send it on every call, Claude Code among
them): its errors take Anthropic's shape and statuses (``{"type": "error", "error":
{"type": "not_found_error", "message": ...}}``, :mod:`gateway.formats.anthropic`); every
other client gets OpenAI's. The request log line records the error type that client was
sent. Sources: https://docs.anthropic.com/en/api/errors,
https://platform.openai.com/docs/guides/error-codes
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import Response

from gateway.endpoint import request_id_of
from gateway.errors import GatewayError
from gateway.formats import anthropic
from gateway.metric_labels import UNKNOWN
from gateway.requestlog import RequestRecord
from gateway.state import Gateway

__all__ = ["ROOT_BODY", "anthropic_caller", "error_answer", "note_error", "refused"]

#: ``GET /`` (and ``GET /v1``): a probe of the base URL answered, naming nothing about the
#: deployment.
ROOT_BODY = b'{"status":"ok","service":"llm-gateway"}'


def anthropic_caller(path: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether the request comes from an Anthropic client: a ``/v1/messages`` path (its
    canonical form), or an ``anthropic-version`` header."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return True
    return any(k == b"anthropic-version" for k, _ in headers)


def error_answer(exc: GatewayError, anthropic_client: bool) -> tuple[int, bytes]:
    """(status, JSON body) of ``exc`` in the caller's API."""
    if anthropic_client:
        return anthropic.error_status(exc), anthropic.error_body(exc)
    return exc.status, exc.body()


def note_error(rec: RequestRecord, exc: GatewayError, anthropic_client: bool) -> None:
    """The log line's status, ``error_type`` and ``error_code`` as the client saw them (and
    ``api``: ``anthropic`` for an Anthropic client)."""
    if anthropic_client:
        rec.api = "anthropic"
        rec.status, rec.error_type = anthropic.error_status(exc), anthropic.error_type(exc)
    else:
        rec.status, rec.error_type = exc.status, exc.type
    rec.error_code = exc.code


def refused(gw: Gateway, request: Request, exc: GatewayError, reason: str) -> Response:
    """The answer to a request no route serves (``reason``: not_found, method_not_allowed),
    in the caller's API, with its ``x-request-id``; one log line (``route`` "unknown",
    ``path`` the canonical path) and the refusal counted (no series per path)."""
    headers = request.scope["headers"]
    rec = RequestRecord(request_id_of(headers, gw.request_ids), UNKNOWN)
    rec.path = request.url.path[:256]
    caller = anthropic_caller(request.url.path, headers)
    note_error(rec, exc, caller)
    status, body = error_answer(exc, caller)
    rec.finish()
    gw.metrics.refuse(reason)
    gw.logger.emit(rec)
    return Response(body, status, media_type="application/json",
                    headers={**exc.headers, "x-request-id": rec.request_id})
