"""Amazon Bedrock's errors, read where they enter: an error response (status, the
``x-amzn-ErrorType`` header, a ``{"message": ...}`` body) or an exception frame of an
event stream (its ``:exception-type`` header), as the status and Anthropic error type the
rest of the gateway reads (dispatch retries 429 and 5xx; the breaker counts them).

========================================  ======  =======================  ==========
Bedrock exception                          AWS     sent on as               type
========================================  ======  =======================  ==========
ValidationException                        400     400                      invalid_request_error
AccessDeniedException                      403     403                      permission_error
UnrecognizedClient, InvalidSignature,      403     403                      authentication_error
ExpiredToken (the gateway's credentials)
ResourceNotFoundException                  404     404                      not_found_error
ThrottlingException, ServiceQuotaExceeded  429/400 429 (retried)            rate_limit_error
ModelNotReadyException                     429     429 (retried)            rate_limit_error
ModelTimeoutException                      408     504 (not retried)        api_error
ModelErrorException, ModelStreamError      424     500 (retried)            api_error
InternalServerException                    500     500                      api_error
ServiceUnavailableException                503     503                      overloaded_error
========================================  ======  =======================  ==========

ServiceQuotaExceeded is a 400 at AWS but a token-per-minute quota: a 429 here, so clients
and dispatch back off rather than give up. ModelTimeout is 504, not 408, which clients
would resend at once. Sources:
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html#API_runtime_InvokeModel_Errors,
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.upstreams.base import RawHeaders

__all__ = ["anthropic_error", "error_name", "mapped", "message_of"]

_EXCEPTIONS: dict[str, tuple[int, str]] = {
    "ValidationException": (400, "invalid_request_error"),
    "AccessDeniedException": (403, "permission_error"),
    "UnrecognizedClientException": (403, "authentication_error"),
    "InvalidSignatureException": (403, "authentication_error"),
    "ExpiredTokenException": (403, "authentication_error"),
    "ResourceNotFoundException": (404, "not_found_error"),
    "ThrottlingException": (429, "rate_limit_error"),
    "ServiceQuotaExceededException": (429, "rate_limit_error"),
    "ModelNotReadyException": (429, "rate_limit_error"),
    "ModelTimeoutException": (504, "api_error"),
    "ModelErrorException": (500, "api_error"),
    "ModelStreamErrorException": (500, "api_error"),
    "InternalServerException": (500, "api_error"),
    "ServiceUnavailableException": (503, "overloaded_error"),
}
_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error",
              403: "permission_error", 404: "not_found_error", 413: "request_too_large",
              429: "rate_limit_error", 503: "overloaded_error"}


def error_name(headers: RawHeaders, body: Any) -> str:
    """The exception's name: the ``x-amzn-ErrorType`` header's (``Name:namespace``), else
    the body's ``__type`` (``namespace#Name``), else ""."""
    for key, value in headers:
        if key.lower() == b"x-amzn-errortype":
            return value.decode("latin-1").split(":", 1)[0].strip()
    kind = body.get("__type") if isinstance(body, dict) else None
    return kind.rsplit("#", 1)[-1] if isinstance(kind, str) else ""


def mapped(name: str, status: int) -> tuple[int, str]:
    """(status sent on, Anthropic error type) for exception ``name`` answered with
    ``status`` (an unknown name: by its status)."""
    known = _EXCEPTIONS.get(name[:1].upper() + name[1:])  # stream frames: throttlingException
    if known is not None:
        return known
    return status, _BY_STATUS.get(status, "api_error" if status >= 500 else
                                  "invalid_request_error")


def message_of(body: Any, name: str) -> str:
    """The error's message (the body's ``message``), else its name."""
    message = body.get("message") or body.get("Message") if isinstance(body, dict) else None
    return message if isinstance(message, str) and message else name or "Bedrock error"


def anthropic_error(status: int, headers: RawHeaders, raw: bytes,
                    name: str = "") -> tuple[int, bytes]:
    """A Bedrock error (``raw``: its body) as (status, an Anthropic error body); ``name``:
    the exception's, when known (a stream frame's)."""
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    name = name or error_name(headers, body)
    status, kind = mapped(name, status)
    error = {"type": kind, "message": message_of(body, name)}
    return status, orjson.dumps({"type": "error", "error": error})
