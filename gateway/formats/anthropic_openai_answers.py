"""Answers and errors between OpenAI Chat Completions and Anthropic Messages, both ways:
a complete ``chat.completion`` body <-> a Messages response body, an OpenAI error body <-> an
Anthropic one. Pure, no I/O; streams are translated elsewhere. Import them through
:mod:`gateway.formats.anthropic_openai`, which re-exports them.

Stop reasons and usage are mapped by :mod:`gateway.formats.anthropic`.
Sources: https://docs.anthropic.com/en/api/messages, https://docs.anthropic.com/en/api/errors,
https://platform.openai.com/docs/api-reference/chat/object,
https://platform.openai.com/docs/guides/error-codes
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import orjson

from gateway.errors import UpstreamError
from gateway.formats.anthropic import (
    error_type_of,
    finish_reason_of,
    stop_reason_of,
    usage_from_openai,
    usage_to_openai,
)

__all__ = ["anthropic_error", "anthropic_response", "openai_error", "openai_response",
           "tool_use_id"]

_BAD_ID = re.compile(r"[^a-zA-Z0-9_-]")


def tool_use_id(call_id: Any) -> str:
    """An id Anthropic accepts (``^[a-zA-Z0-9_-]+$``) for an OpenAI tool call id: some
    servers write ``functions.get_weather:0``. The same id always gives the same answer, so a
    tool call and its result still match; a missing id gets a new one."""
    if not isinstance(call_id, str) or not call_id:
        return "toolu_" + uuid.uuid4().hex
    return _BAD_ID.sub("_", call_id)


def anthropic_response(body: bytes, model: str | None = None) -> bytes:
    """The Messages response body (bytes) for an OpenAI ``chat.completion`` body (HTTP 200).

    ``{id: "msg_" + the completion id without its "chatcmpl-" (and "msg_") prefix, or a new
    one, type "message", role "assistant", model: ``model`` or the body's, content: [a text
    block (or the refusal) when there is text, tool_use blocks], stop_reason, stop_sequence:
    null, usage}``.
    Tool call arguments that are not a JSON object become ``input: {}`` (the client's tool
    reports the missing arguments better than a failed answer would). A tool call answered
    with ``finish_reason: "stop"`` (some servers do) gets ``stop_reason: "tool_use"``, which
    Anthropic tool loops wait for. Reasoning text (``reasoning_content``) is dropped: an
    Anthropic thinking block needs a signature. Raises UpstreamError (502) for a body that
    is not a completion.
    """
    try:
        completion = orjson.loads(body)
        choice = completion["choices"][0]
        message = choice["message"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise UpstreamError("the upstream's answer is not a chat.completion") from exc
    content: list[dict[str, Any]] = []
    text = message.get("content") or message.get("refusal")
    if isinstance(text, list):  # content parts, as a few servers answer
        text = "".join(part.get("text") or "" for part in text)
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {}
        content.append({"type": "tool_use", "id": tool_use_id(call.get("id")),
                        "name": function.get("name", ""),
                        "input": arguments if isinstance(arguments, dict) else {}})
    stop = stop_reason_of(choice.get("finish_reason")) or "end_turn"
    if stop == "end_turn" and any(block["type"] == "tool_use" for block in content):
        stop = "tool_use"
    id_ = completion.get("id")
    rest = id_.removeprefix("chatcmpl-").removeprefix("msg_") if isinstance(id_, str) else ""
    return orjson.dumps({
        "id": "msg_" + (rest or uuid.uuid4().hex), "type": "message", "role": "assistant",
        "model": model if model is not None else completion.get("model", ""),
        "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": usage_from_openai(completion.get("usage") or {}),
    })


def openai_response(body: bytes, model: str | None = None) -> bytes:
    """The ``chat.completion`` body (bytes) for an Anthropic Messages response body.

    ``{id: "chatcmpl-" + the message id (or a new one), object, created (now,
    epoch seconds), model: ``model`` or the body's, choices: [{index 0, message: {role
    "assistant", content: the text blocks joined (None when none), refusal None, tool_calls
    (from tool_use blocks) when any}, logprobs None, finish_reason}], usage}``. Thinking and
    server-tool blocks are dropped. Raises UpstreamError (502) for a body that is not a
    Messages response.
    """
    try:
        answer = orjson.loads(body)
        blocks = answer["content"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
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
    return orjson.dumps({
        "id": "chatcmpl-" + (id_ if isinstance(id_, str) and id_ else uuid.uuid4().hex),
        "object": "chat.completion", "created": int(time.time()),
        "model": model if model is not None else answer.get("model", ""),
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason_of(answer.get("stop_reason")) or "stop"}],
        "usage": usage_to_openai(answer.get("usage") or {}),
    })


# -- errors ----------------------------------------------------------------------------------

def _error_message(body: bytes) -> str | None:
    """The message of an OpenAI error body (or of the shapes vLLM and FastAPI answer with)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    error = obj.get("error")
    for found in (error.get("message") if isinstance(error, dict) else error,
                  obj.get("message"), obj.get("detail")):
        if isinstance(found, str) and found:
            return found
    return None


def anthropic_error(status: int, body: bytes) -> tuple[int, bytes]:
    """``(status, body)`` on the Anthropic surface for an OpenAI-compatible upstream's error
    answer: ``{"type": "error", "error": {"type", "message"}}``, the message kept, the type
    by status. 503 becomes 529 ``overloaded_error`` (what Anthropic clients expect when
    capacity runs out); other statuses are kept. A body with no message gets
    ``"upstream error (HTTP <status>)"``."""
    message = _error_message(body) or f"upstream error (HTTP {status})"
    if status == 503:
        status = 529
    return status, orjson.dumps({"type": "error", "error": {
        "type": error_type_of(status), "message": message}})


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


def openai_error(status: int, body: bytes) -> bytes:
    """The OpenAI error body ``{"error": {message, type, param: null, code}}`` for an
    Anthropic error answer (``{"type": "error", "error": {type, message}}``): the message
    kept, the type mapped (``rate_limit_error`` -> ``rate_limit_error`` /
    ``rate_limit_exceeded``, ``overloaded_error`` -> ``overloaded_error`` / ``overloaded``,
    ``billing_error`` -> ``insufficient_quota``...). A body that is not an Anthropic error
    gets ``"upstream error (HTTP <status>)"`` and the type Anthropic gives that status. The
    status is the caller's to keep (Anthropic's 529 is a 5xx the openai SDK retries)."""
    kind, message = error_type_of(status), f"upstream error (HTTP {status})"
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, dict):
        if isinstance(error.get("type"), str):
            kind = error["type"]
        if isinstance(error.get("message"), str) and error["message"]:
            message = error["message"]
    type_, code = _OPENAI_ERRORS.get(kind, ("upstream_error", "upstream_error"))
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None,
                                   "code": code}})
