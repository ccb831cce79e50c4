"""The gateway's one error hierarchy.

Every error a client can see knows its HTTP status and its OpenAI error ``type``/``code``,
and renders itself as OpenAI error JSON (https://platform.openai.com/docs/guides/error-codes)::

    GatewayError
     ├── InvalidRequest            400 invalid_request_error
     │    ├── InvalidJSON          400 invalid_request_error / invalid_json
     │    ├── MethodNotAllowed     405 invalid_request_error / method_not_allowed
     │    ├── RequestTimeout       408 invalid_request_error / request_timeout
     │    ├── RequestTooLarge      413 invalid_request_error / request_too_large
     │    └── HeadersTooLarge      431 invalid_request_error / request_header_fields_too_large
     ├── AuthenticationFailed      401 authentication_error / invalid_api_key
     ├── PermissionDenied          403 permission_error / forbidden
     ├── ModelNotFound             404 invalid_request_error / model_not_found
     ├── NotFound                  404 invalid_request_error / not_found
     │    └── StreamNotFound       404 invalid_request_error / stream_not_found
     ├── StreamAbandoned           499 server_error / stream_cancelled (an event only)
     ├── UpstreamError             502 upstream_error / upstream_error
     │    ├── UpstreamUnreachable  502 upstream_error / upstream_unreachable
     │    ├── UpstreamTimeout      504 upstream_error / upstream_timeout
     │    └── UpstreamStalled      504 upstream_error / upstream_stalled
     │         └── FirstTokenTimeout  504 upstream_error / first_token_timeout
     ├── RateLimited               429 requests|tokens / rate_limit_exceeded (a key's RPM/TPM)
     ├── NoUpstreamAvailable       503 overloaded_error / no_upstream_available
     └── Overloaded                503 overloaded_error / degraded_mode (shed)
          └── TenantLimited        429 overloaded_error / degraded_mode (a key's own limit)

Library errors (httpx, orjson, tomllib) are converted where they enter, with ``from exc``.
``ConfigError`` is separate: it never reaches a client, it names a file and a key.
"""

from __future__ import annotations

import math

from llm_wire.errors import APIError, error_body

__all__ = [
    "AuthenticationFailed",
    "ConfigError",
    "FirstTokenTimeout",
    "GatewayError",
    "HeadersTooLarge",
    "InvalidJSON",
    "InvalidRequest",
    "MethodNotAllowed",
    "ModelNotFound",
    "NoUpstreamAvailable",
    "NotFound",
    "Overloaded",
    "PermissionDenied",
    "RateLimited",
    "RequestTimeout",
    "RequestTooLarge",
    "StreamAbandoned",
    "StreamNotFound",
    "TenantLimited",
    "UpstreamError",
    "UpstreamStalled",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "error_body",
]


class GatewayError(APIError):
    """Base of every error that becomes an HTTP response.

    Attributes (from :class:`llm_wire.errors.APIError`): ``status`` (HTTP status), ``type``
    and ``code`` (OpenAI ``error.type`` and ``error.code``), ``param`` (the offending
    request field, or None), ``headers`` (extra response headers, e.g. ``Retry-After``);
    ``body()`` renders the OpenAI error JSON, ``as_dict()`` the inner object.
    """


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"


class MethodNotAllowed(InvalidRequest):
    """A path the gateway serves, asked with a method it does not take (``Allow`` in
    ``headers`` names those it does)."""

    status = 405
    code = "method_not_allowed"


class RequestTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class RequestTimeout(InvalidRequest):
    """A request's head did not arrive in time (gateway.connections)."""

    status = 408
    code = "request_timeout"


class HeadersTooLarge(InvalidRequest):
    """A request's line and headers are over ``server.max_header_bytes``
    (gateway.connections)."""

    status = 431
    code = "request_header_fields_too_large"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


# -- issue 48: resumable streams (gateway.resume) --------------------------------------------
class StreamNotFound(NotFound):
    """A stream to resume that this key cannot have: unknown, expired, evicted, another
    key's (never told apart)."""

    code = "stream_not_found"


class StreamAbandoned(GatewayError):
    """Ends a kept stream whose upstream was cancelled with no client reading it (only ever
    an error event, for a client resuming it later)."""

    status = 499
    type = "server_error"  # one of the error types counted from start-up (metric_labels)
    code = "stream_cancelled"
# -- end issue 48 ------------------------------------------------------------------------------


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"


class UpstreamUnreachable(UpstreamError):
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


# -- issue 48: a stream that stops making progress (gateway.stream_watch) -------------------
class UpstreamStalled(UpstreamError):
    """An upstream's open stream stopped making progress (:mod:`gateway.stream_watch`):
    ``reason`` ``idle`` (no event but pings or comments for ``stream_idle_timeout_ms``) or
    ``slow`` (under ``min_tokens_per_s``). Raised where the stream is read, the upstream's
    response closed: the relay ends the client's stream with it as an error event in the
    client's format (the place a continuation would take over instead). Unlike
    :class:`UpstreamTimeout`, not a reason to keep waiting."""

    status = 504
    code = "upstream_stalled"

    def __init__(self, message: str, *, reason: str = "idle") -> None:
        super().__init__(message)
        self.reason = reason


class FirstTokenTimeout(UpstreamStalled):
    """No text, tool-call or reasoning delta within an attempt's first-token deadline
    (:mod:`gateway.stream_watch`), nothing sent to the client yet: the attempt is closed and
    retried as a failure before the first byte, on the model's next target at once when
    ``next_target``."""

    code = "first_token_timeout"

    def __init__(self, message: str, *, next_target: bool) -> None:
        super().__init__(message, reason="first_token")
        self.next_target = next_target


class RateLimited(GatewayError):
    """A key's requests or tokens per minute are spent (see gateway.stages.rate_limit).
    ``type`` is ``requests`` or ``tokens`` and ``code`` ``rate_limit_exceeded``, as OpenAI
    sends them; ``Retry-After`` (s) and ``retry-after-ms`` say when the request fits."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, kind: str, retry_after_s: float) -> None:
        super().__init__(message, headers={
            "Retry-After": str(max(1, math.ceil(retry_after_s))),
            "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000)))})
        self.type = kind


class NoUpstreamAvailable(GatewayError):
    status = 503
    type = "overloaded_error"
    code = "no_upstream_available"


class Overloaded(GatewayError):
    """Shed: the gateway answers at once instead of queueing without bound. ``reason`` goes to
    the ``x-gateway-degraded`` header and the log line; ``Retry-After`` (whole seconds) says
    when to retry, and ``retry-after-ms`` (read first by the openai and anthropic SDKs), when
    given, a jittered time that keeps shed clients from coming back all at once."""

    status = 503
    type = "overloaded_error"
    code = "degraded_mode"

    def __init__(self, message: str, *, reason: str, retry_after_s: float,
                 retry_after_ms: float | None = None):
        headers = {"Retry-After": str(max(0, math.ceil(retry_after_s))),
                   "x-gateway-degraded": reason}
        if retry_after_ms is not None:
            headers["retry-after-ms"] = str(max(1, math.floor(retry_after_ms)))
        super().__init__(message, headers=headers)
        self.reason = reason


class TenantLimited(Overloaded):
    status = 429


class ConfigError(Exception):
    """A configuration or policy file is invalid: the message names the file and the key."""

    def __init__(self, path: str, key: str, message: str) -> None:
        super().__init__(f"{path}: {key}: {message}" if key else f"{path}: {message}")
        self.path = path
        self.key = key
