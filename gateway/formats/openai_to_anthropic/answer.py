"""An OpenAI client calling an Anthropic upstream: the upstream's complete answer becomes a
``chat.completion`` body, its error an OpenAI error body. Pure, no I/O.

    openai_response(answer, model=None) -> the chat.completion (a dict)
    openai_error(status, error)         -> the OpenAI error object (a dict)

Both take the upstream's body already parsed (dispatch parses it once, and serialises
what they return).

Stop reasons, usage and error types by status are mapped by :mod:`gateway.formats.anthropic`.
Sources: https://docs.anthropic.com/en/api/messages, https://docs.anthropic.com/en/api/errors,
https://platform.openai.com/docs/api-reference/chat/object,
https://platform.openai.com/docs/guides/error-codes
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.errors import UpstreamError
from gateway.formats.anthropic import error_type_of, finish_reason_of, usage_to_openai
from gateway.formats.ids import random_hex

__all__ = ["openai_error", "openai_response"]


def openai_response(answer: Any, model: str | None = None) -> dict[str, Any]:
    """The ``chat.completion`` for an Anthropic Messages response (its parsed body).

    ``{id: "chatcmpl-" + the message id (or a new one), object, created (now,
    epoch seconds), model: ``model`` or the body's, choices: [{index 0, message: {role
    "assistant", content: the text blocks joined (None when none), refusal None, tool_calls
    (from tool_use blocks) when any}, logprobs None, finish_reason}], usage}``. Thinking and
    server-tool blocks are dropped. Raises UpstreamError (502) for a body that is not a
    Messages response (None: not JSON).
    """
    try:
        blocks = answer["content"]
    except (KeyError, TypeError) as exc:
        raise UpstreamError("the upstream's answer is not a Messages response") from exc
    texts = [b["text"] for b in blocks if b.get("type") == "text"]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts
                               else None, "refusal": None}
    calls = [{"id": b["id"], "type": "function", "function": {
        "name": b["name"], "arguments": orjson.dumps(b.get("input", {})).decode()}}
        for b in blocks if b.get("type") == "tool_use"]
    if calls:
        message["tool_calls"] = calls
    id_ = answer.get("id")  # kept whole, as the stream translator does: traceable in logs
    return {
        "id": "chatcmpl-" + (id_ if isinstance(id_, str) and id_ else random_hex()),
        "object": "chat.completion", "created": int(time.time()),
        "model": model if model is not None else answer.get("model", ""),
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason_of(answer.get("stop_reason")) or "stop"}],
        "usage": usage_to_openai(answer.get("usage") or {}),
    }


# -- errors ----------------------------------------------------------------------------------

#: Anthropic error type -> OpenAI (type, code).
_OPENAI_ERRORS = {
    "invalid_request_error": ("invalid_request_error", "invalid_request"),
    "authentication_error": ("authentication_error", "invalid_api_key"),
    "billing_error": ("insufficient_quota", "insufficient_quota"),
    "permission_error": ("permission_error", "forbidden"),
    "not_found_error": ("invalid_request_error", "not_found"),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit_error": ("rate_limit_error", "rate_limit_exceeded"),
    "timeout_error": ("upstream_error", "upstream_timeout"),
    "api_error": ("server_error", "internal_error"),
    "overloaded_error": ("overloaded_error", "overloaded"),
}


def openai_error(status: int, body: Any) -> dict[str, Any]:
    """The OpenAI error object ``{"error": {message, type, param: null, code}}`` for an
    Anthropic error answer (its parsed body, ``{"type": "error", "error": {type, message}}``;
    None when it is not JSON): the message
    kept, the type mapped (``rate_limit_error`` -> ``rate_limit_error`` /
    ``rate_limit_exceeded``, ``overloaded_error`` -> ``overloaded_error`` / ``overloaded``,
    ``billing_error`` -> ``insufficient_quota``...). A body that is not an Anthropic error
    gets ``"upstream error (HTTP <status>)"`` and the type Anthropic gives that status. The
    status is the caller's to keep (Anthropic's 529 is a 5xx the openai SDK retries)."""
    kind, message = error_type_of(status), f"upstream error (HTTP {status})"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        if isinstance(error.get("type"), str):
            kind = error["type"]
        if isinstance(error.get("message"), str) and error["message"]:
            message = error["message"]
    type_, code = _OPENAI_ERRORS.get(kind, ("upstream_error", "upstream_error"))
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}
