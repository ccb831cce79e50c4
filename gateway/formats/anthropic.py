"""The Anthropic Messages wire format: requests in, answers and errors out. Pure, no I/O.

Requests are parsed once and checked at the door (:func:`parse_request`): only what the
gateway relies on; unknown fields (and ``thinking``, ``cache_control``, system-role messages
inside ``messages``...) pass through untouched, so new API fields work on day one. :func:`chat_view` shows a request as OpenAI
chat for cache keys and routing. Answers (:class:`~gateway.formats.answer.Answer`) are read
from Messages bodies and rendered as bodies or event streams; errors take Anthropic's shape
and statuses. Event streams are read by :class:`StreamObserver` and :class:`AnswerCollector`
(from :mod:`gateway.formats.anthropic_stream`, with :func:`finish_reason_of`).

Wire format: https://docs.anthropic.com/en/api/messages (streaming:
https://docs.anthropic.com/en/docs/build-with-claude/streaming, errors:
https://docs.anthropic.com/en/api/errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.errors import (
    GatewayError,
    NoUpstreamAvailable,
    Overloaded,
)
from gateway.formats.answer import Answer
from gateway.formats.anthropic_stream import AnswerCollector, StreamObserver, finish_reason_of
from gateway.formats.checks import (
    invalid_type,
    invalid_value,
    load_request,
    message_list,
    missing,
    shown,
)
from gateway.formats.ids import random_hex
from llm_wire.sse import json_event

__all__ = [
    "SYSTEM_ROLE_REFUSED", "AnswerCollector", "StreamObserver", "answer_from_message",
    "chat_view", "error_body", "error_event", "error_status", "error_type", "error_type_of",
    "finish_reason_of", "message_body", "message_events", "parse_request", "stop_reason_of",
    "usage_to_openai",
]

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
         "function_call": "tool_use", "content_filter": "refusal"}


def stop_reason_of(finish_reason: str | None) -> str | None:
    """Anthropic's ``stop_reason`` for an OpenAI ``finish_reason`` (None stays None)."""
    if finish_reason is None:
        return None
    return _STOP.get(finish_reason, "end_turn")


def usage_to_openai(usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic usage -> OpenAI usage. Anthropic's ``input_tokens`` excludes the prompt
    tokens read from or written to its cache; OpenAI's ``prompt_tokens`` counts all input,
    with the cache reads in ``prompt_tokens_details.cached_tokens``."""
    read = usage.get("cache_read_input_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + read + written
    completion = usage.get("output_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": read}}


# -- requests --------------------------------------------------------------------------------

def parse_request(raw: bytes) -> dict[str, Any]:
    """The Messages request body as a dict, unchanged.

    Checked: what the gateway reads (``model``, ``max_tokens``, ``stream``, the shape of
    ``messages`` and ``system`` that the stages walk, the sampling and tool fields the cache
    and the translators read), each only as far as Anthropic itself refuses it. A message's
    role is any string: ``system`` inside ``messages`` is Anthropic's mid-conversation
    system message, sent on as it came: where it may sit, and which model takes it, is the
    upstream's to say (https://platform.claude.com/docs/en/build-with-claude/
    mid-conversation-system-messages).
    Raises InvalidJSON (not JSON) or InvalidRequest (400, ``param`` naming the field, e.g.
    ``messages[2].content[0].type``; ``code`` ``missing_required_parameter``,
    ``invalid_type`` or ``invalid_value``). Optional fields set to null are left to the
    upstream. Source: https://docs.anthropic.com/en/api/messages
    """
    data = load_request(raw)
    if data.get("max_tokens") is None:
        raise missing("max_tokens")
    _check_messages(data.get("messages"))
    for name, value in data.items():  # only the fields present, usually a handful
        check = _CHECKS.get(name)
        if check is not None and value is not None:
            check(name, value)
    return data


def _check_messages(messages: Any) -> None:
    """What the stages read: a non-empty array of objects, each with a string ``role``
    (any: ``system`` under Anthropic's mid-conversation system messages, and a role the
    gateway does not know is the upstream's to refuse in its own words) and a ``content``
    that is a string or an array of objects with a string ``type``."""
    messages = message_list(messages)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid_type(where, "an object", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise missing(f"{where}.role") if role is None else invalid_type(
                f"{where}.role", "a string", role)
        content = message.get("content")
        if isinstance(content, list):
            for j, block in enumerate(content):
                if not isinstance(block, dict):
                    raise invalid_type(f"{where}.content[{j}]", "an object", block)
                if not isinstance(block.get("type"), str):
                    raise invalid_type(f"{where}.content[{j}].type", "a string", block.get("type"))
        elif not isinstance(content, str):
            raise missing(f"{where}.content") if content is None else invalid_type(
                f"{where}.content", "a string or an array of content blocks", content)


def _check_unit(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise invalid_value(name, f"'{name}' must be a number between 0 and 1, got {shown(value)}")


def _check_int(name: str, value: Any) -> None:
    least = 1 if name == "max_tokens" else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise invalid_value(name, f"'{name}' must be an integer >= {least}, got {shown(value)}")


def _check_kind(kind: type, expected: str) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if not isinstance(value, kind):
            raise invalid_type(name, expected, value)
    return check


def _check_array(kind: type, expected: str) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if not isinstance(value, list):
            raise invalid_type(name, "an array", value)
        for i, item in enumerate(value):
            if not isinstance(item, kind):
                raise invalid_type(f"{name}[{i}]", expected, item)
    return check


def _check_tool_choice(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise invalid_type(name, "an object", value)
    kind = value.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise missing("tool_choice.type") if kind is None else invalid_value(
            "tool_choice.type", "'tool_choice.type' must be one of \"auto\", \"any\", "
                                f"\"tool\", \"none\", got {shown(kind)}")
    if kind == "tool" and not isinstance(value.get("name"), str):
        tool = value.get("name")
        raise missing("tool_choice.name") if tool is None else invalid_type(
            "tool_choice.name", "a string", tool)


def _check_system(name: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise invalid_type(name, "a string or an array of text blocks", value)
    for i, block in enumerate(value):
        if not isinstance(block, dict):
            raise invalid_type(f"system[{i}]", "an object", block)
        if block.get("type") != "text":
            raise invalid_value(f"system[{i}].type", f"'system[{i}].type' must be \"text\", "
                                              f"got {shown(block.get('type'))}")
        if not isinstance(block.get("text"), str):
            raise invalid_type(f"system[{i}].text", "a string", block.get("text"))


_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "max_tokens": _check_int, "top_k": _check_int, "temperature": _check_unit,
    "top_p": _check_unit, "stream": _check_kind(bool, "a boolean"),
    "metadata": _check_kind(dict, "an object"),
    "stop_sequences": _check_array(str, "a string"), "tools": _check_array(dict, "an object"),
    "tool_choice": _check_tool_choice, "system": _check_system,
}


def chat_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request as the gateway's cache keys and router features read it: a shallow copy
    of ``body`` without ``system``, whose ``messages`` start with ``{"role": "system",
    "content": <system>}`` when a system prompt is given (a system-role message later in
    ``messages`` stays where it is, as an OpenAI system message would). Message dicts are
    shared, not copied (Anthropic text blocks already look like OpenAI text parts)."""
    view = dict(body)
    system = view.pop("system", None)
    messages = body.get("messages") or []
    view["messages"] = [{"role": "system", "content": system}, *messages] \
        if system is not None else list(messages)
    return view


# -- answers ---------------------------------------------------------------------------------

_CHUNK_CHARS = 64  # characters per text_delta when a stored answer is streamed
_KEPT = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls"}  # finishes


def answer_from_message(obj: Any, allow_tools: bool) -> Answer | None:
    """The answer of a Messages response (its body parsed) if it may be kept, else None:
    not JSON (None), an
    error, not finished by ``end_turn``/``stop_sequence``/``tool_use``, a block other than
    ``text`` (without citations) or ``tool_use`` (thinking is never kept), or ``tool_use``
    when not ``allow_tools``. Text blocks are joined; ``tool_use`` blocks become OpenAI tool
    calls (``arguments``: ``input`` as JSON); usage is converted by :func:`usage_to_openai`."""
    if not isinstance(obj, dict) or obj.get("type") != "message":
        return None
    finish = _KEPT.get(str(obj.get("stop_reason")))
    blocks = obj.get("content")
    if finish is None or not isinstance(blocks, list):
        return None
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, dict):
            return None
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str) and not block.get("citations"):
            texts.append(block["text"])
        elif kind == "tool_use" and allow_tools and isinstance(block.get("id"), str) \
                and isinstance(block.get("name"), str) and isinstance(block.get("input"), dict):
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": orjson.dumps(block["input"]).decode()}})
        else:
            return None
    usage = obj.get("usage")
    # No text block at all: a pure tool call, or an empty answer (content []).
    content = "".join(texts) if texts or not calls else None
    return Answer.complete(content, finish, str(obj.get("model") or ""), calls,
                           usage_to_openai(usage) if isinstance(usage, dict) else None,
                           allow_tools)


def _message(answer: Answer, id_: str | None) -> dict[str, Any]:
    """The Messages response for ``answer``. No empty text block: the API rejects one when a
    client sends the message back as an assistant turn. A cache hit's prompt counts as read
    from cache, as the OpenAI rendering counts it cached."""
    blocks: list[dict[str, Any]] = []
    if answer.content:
        blocks.append({"type": "text", "text": answer.content})
    for call in answer.tool_calls or ():
        function = call["function"]
        arguments = orjson.loads(function.get("arguments") or "{}")
        if not isinstance(arguments, dict):  # a ValueError, as arguments that are not JSON
            raise ValueError("tool call arguments are not a JSON object")  # noqa: TRY004
        blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"],
                       "input": arguments})
    return {"id": id_ or "msg_" + random_hex(), "type": "message", "role": "assistant",
            "model": answer.model, "content": blocks,
            "stop_reason": stop_reason_of(answer.finish_reason), "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": answer.completion_tokens or 0,
                      "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": answer.prompt_tokens or 0}}


def message_body(answer: Answer, id_: str | None = None) -> bytes:
    """A whole Messages response for ``answer`` (bytes): a text block when it has text, a
    ``tool_use`` block per tool call, ``stop_reason`` from its finish reason, and usage
    ``{input_tokens: 0, output_tokens, cache_creation_input_tokens: 0,
    cache_read_input_tokens: <prompt tokens>}``. ``id_``: default ``msg_<uuid hex>``.
    Raises ValueError when a tool call's arguments are not a JSON object."""
    return orjson.dumps(_message(answer, id_))


def message_events(answer: Answer, id_: str | None = None) -> bytes:
    """The whole event stream of ``answer`` (one write: it is already complete), in the
    order Anthropic sends it: ``message_start`` (empty content, null stop reason), per block
    ``content_block_start`` / ``content_block_delta`` (``text_delta`` of at most 64
    characters, or one ``input_json_delta``) / ``content_block_stop``, ``message_delta``
    (stop reason, ``output_tokens``), ``message_stop``. Accumulated, it is
    :func:`message_body`'s message. Raises ValueError as :func:`message_body` does."""
    message = _message(answer, id_)
    usage = message["usage"]
    out = [_event("message_start", message={**message, "content": [], "stop_reason": None,
                                            "usage": {**usage, "output_tokens": 0}})]
    for index, block in enumerate(message["content"]):
        start: dict[str, Any]
        if block["type"] == "text":
            start, text = {"type": "text", "text": ""}, block["text"]
            deltas = [{"type": "text_delta", "text": text[i:i + _CHUNK_CHARS]}
                      for i in range(0, len(text), _CHUNK_CHARS)]
        else:
            start = {**block, "input": {}}
            deltas = [{"type": "input_json_delta",
                       "partial_json": orjson.dumps(block["input"]).decode()}]
        out.append(_event("content_block_start", index=index, content_block=start))
        out.extend(_event("content_block_delta", index=index, delta=d) for d in deltas)
        out.append(_event("content_block_stop", index=index))
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    out.append(_event("message_delta", delta=stop, usage={"output_tokens": usage["output_tokens"]}))
    out.append(_event("message_stop"))
    return b"".join(out)


def _event(kind: str, **fields: Any) -> bytes:
    """One named event, its ``type`` first as Anthropic writes it."""
    return json_event({"type": kind, **fields}, kind)


# -- errors ----------------------------------------------------------------------------------

#: Anthropic's own words (a 400 ``invalid_request_error``) for a system-role message inside
#: ``messages`` that cannot be taken. Clients recover on them: Claude Code, sending
#: mid-conversation system messages (its ``mid-conversation-system-2026-04-07`` beta),
#: retries once with them folded into its user turns when a 400 says "Unexpected role" and
#: "input message role", or "not supported" and "role 'system'" (Claude Code 2.1.197).
SYSTEM_ROLE_REFUSED = ('messages: Unexpected role "system". The Messages API accepts a '
                       'top-level `system` parameter, not "system" as an input message role.')

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                402: "billing_error", 403: "permission_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                504: "timeout_error", 529: "overloaded_error"}


def error_type_of(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status: 400 invalid_request_error, 401
    authentication_error, 402 billing_error, 403 permission_error, 404 not_found_error, 413
    request_too_large, 429 rate_limit_error, 503/529 overloaded_error, 504 timeout_error,
    other 5xx api_error, other 4xx invalid_request_error.
    Source: https://docs.anthropic.com/en/api/errors"""
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500
                                        else "invalid_request_error")


def error_status(exc: GatewayError) -> int:
    """The HTTP status on the Anthropic surface: a shed (:class:`Overloaded`) or
    :class:`NoUpstreamAvailable` 503 becomes 529, as Anthropic reports overload; a
    :class:`~gateway.errors.TenantLimited` keeps its 429; everything else keeps
    ``exc.status``."""
    if isinstance(exc, (Overloaded, NoUpstreamAvailable)) and exc.status == 503:
        return 529
    return exc.status


def error_type(exc: GatewayError) -> str:
    """Anthropic's ``error.type`` for ``exc``: :func:`error_type_of` its
    :func:`error_status` on this surface."""
    return error_type_of(error_status(exc))


def _error(exc: GatewayError) -> dict[str, Any]:
    message = exc.message
    # Anthropic's error object has no ``param``: the message must name the field.
    if exc.param and exc.param not in message:
        message = f"{message} (parameter: {exc.param})"
    return {"type": "error", "error": {"type": error_type(exc), "message": message}}


def error_body(exc: GatewayError) -> bytes:
    """``{"type": "error", "error": {"type": ..., "message": ...}}`` for ``exc`` (bytes);
    send it with :func:`error_status`."""
    return orjson.dumps(_error(exc))


def error_event(exc: GatewayError) -> bytes:
    """``event: error`` carrying the same object; the anthropic SDK raises on it."""
    return json_event(_error(exc), "error")
