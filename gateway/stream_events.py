"""What an upstream's stream event means to the stream watch (:mod:`gateway.stream_watch`),
in the upstream's own wire format: pure, I/O-free.

Each event is one of:

- ``OPENING``: bookkeeping before or around the answer (OpenAI's role chunk, Anthropic's
  ``message_start`` and ``content_block_start``, Responses' ``response.created``,
  ``response.in_progress``, ``output_item.added``...): proof the upstream is alive, not that
  it is answering.
- ``PING``: a keep-alive (Anthropic's ``event: ping``; SSE comments never reach here: the
  reader drops them).
- ``CONTENT``: a text, tool-call or reasoning delta: the answer has begun (the first-token
  deadline is met).
- ``END``: the answer's end or an error event (``finish_reason`` set, ``[DONE]``,
  ``message_delta``/``message_stop``, ``response.completed``/``failed``/``incomplete``,
  ``error``): a short or failed answer, to pass on as it is.

Sources: https://platform.openai.com/docs/api-reference/chat-streaming,
https://docs.anthropic.com/en/docs/build-with-claude/streaming,
https://platform.openai.com/docs/api-reference/responses-streaming,
https://ai.google.dev/api/generate-content#method:-models.streamgeneratecontent
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from llm_wire.sse import Event, parse_event

__all__ = ["CONTENT", "END", "MARKS", "OPENING", "PING", "alive", "kind_of", "retryable_error"]

OPENING, PING, CONTENT, END = 0, 1, 2, 3

_DELTA_FIELDS = ("content", "tool_calls", "function_call", "reasoning_content", "reasoning",
                 "refusal")
_ANTHROPIC_END = frozenset(("message_delta", "message_stop", "error"))
#: api -> a pattern every CONTENT or END event of its streams holds (in its name or its
#: data's type), so that a block of whole events without it is all OPENING or PING,
#: unparsed (a match is no proof: the events are parsed then). None for OpenAI's, told
#: event by event without parsing (:func:`_openai`).
MARKS: dict[str, re.Pattern[bytes] | None] = {
    "anthropic": re.compile(rb"delta|message_stop|error"),
    "responses": re.compile(rb"delta|completed|failed|incomplete|error"),
    "converse": re.compile(rb"Delta|messageStop|metadata|error"),
    "gemini": re.compile(rb"parts|finishReason|blockReason|error"),
    "openai": None}
#: In an OpenAI chunk with an empty "content": any other field of a delta (or an error, a
#: legacy completion's text) with a value that is not null; without one it is OPENING.
_OPENAI_OTHER = re.compile(rb'"(?:tool_calls|function_call|reasoning_content|reasoning|'
                           rb'refusal|text|error|finish_reason)":\s*[^n\s]')
_CONVERSE_END = frozenset(("messageStop", "metadata", "error"))
_RESPONSES_END = frozenset(("response.completed", "response.failed", "response.incomplete",
                            "error"))


def kind_of(api: str, event: Event) -> int:
    """``event`` (parsed: name, data) of a stream in ``api`` (``openai``: Chat Completions
    or legacy completions; ``anthropic``: Messages; ``responses``; ``converse``: Bedrock's
    ConverseStream; ``gemini``: streamGenerateContent) as OPENING, PING, CONTENT or END."""
    name, data = event
    if api == "anthropic":
        kind = name if name is not None else _type(data)
        if kind == "ping":
            return PING
        if kind == "content_block_delta":
            return CONTENT
        return END if kind in _ANTHROPIC_END else OPENING
    if api == "converse":  # Bedrock's ConverseStream, as gateway.upstreams.bedrock_stream names it
        if name == "contentBlockDelta":
            return CONTENT
        return END if name in _CONVERSE_END else OPENING
    if api == "responses":
        kind = name if name is not None else _type(data)
        if kind is None:
            return OPENING
        if kind.endswith(".delta"):
            return CONTENT
        return END if kind in _RESPONSES_END else OPENING
    if api == "gemini":
        return _gemini(data)
    return _openai(data)


def _gemini(data: bytes) -> int:
    """A streamGenerateContent event: END with a finishReason, a blocked prompt or an
    error; CONTENT with a part (text, functionCall, thought); else OPENING."""
    obj = _json(data)
    if not isinstance(obj, dict):
        return OPENING
    if "error" in obj or (obj.get("promptFeedback") or {}).get("blockReason"):
        return END
    for candidate in obj.get("candidates") or ():
        if not isinstance(candidate, dict):
            continue
        if candidate.get("finishReason"):
            return END
        if ((candidate.get("content") or {}).get("parts")):
            return CONTENT
    return OPENING


#: In-band error types that are the request's own fault: sent again, it fails again.
_CLIENT_ERRORS = frozenset(("invalid_request_error", "authentication_error", "permission_error",
                            "not_found_error", "request_too_large", "billing_error",
                            "context_length_exceeded", "invalid_prompt"))


def retryable_error(api: str, event: Event) -> str | None:
    """The error type of ``event`` (an END event of ``api``'s stream) where it is an error
    event another attempt may not meet (a server's fault: overloaded, api_error,
    server_error...; unknown types too), else None (a finish, or the request's own fault)."""
    name, data = event
    obj = _json(data)
    if not isinstance(obj, dict):
        return None
    if api == "responses" and (name or obj.get("type")) == "response.failed":
        obj = obj.get("response") if isinstance(obj.get("response"), dict) else {}
    error = obj.get("error")
    if api == "responses" and (name or obj.get("type")) == "error":
        error = obj
    if not isinstance(error, dict):
        return None
    kind = error.get("type") if api != "responses" else error.get("code")
    kind = kind if isinstance(kind, str) and kind else "error"
    return None if kind in _CLIENT_ERRORS or error.get("code") in _CLIENT_ERRORS else kind


def _type(data: bytes) -> str | None:
    obj = _json(data)
    kind = obj.get("type") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else None


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _openai(data: bytes) -> int:
    if data == b"[DONE]":
        return END
    # the common answering chunk, told without parsing it: a non-empty "content" string (a
    # key's quotes are never inside a JSON string, where they are escaped)
    at = data.find(b'"content":"')
    if at >= 0:
        if data[at + 11:at + 12] != b'"':
            return CONTENT
        if _OPENAI_OTHER.search(data) is None:  # the role chunk: empty content, no other
            return OPENING
    obj = _json(data)
    if not isinstance(obj, dict):
        return OPENING
    if "error" in obj:
        return END
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return OPENING
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for field in _DELTA_FIELDS:
                if delta.get(field):
                    return CONTENT
        if choice.get("text"):  # legacy completions
            return CONTENT
        if choice.get("finish_reason") is not None:
            return END
    return OPENING


def alive(chunk: bytes) -> bool:
    """Whether ``chunk`` (stream bytes as they arrived) holds anything but keep-alives: an
    event other than a ping, or part of one. Called on every chunk once an answer streams,
    so the common case is two slice comparisons; a chunk cut inside an event counts as
    alive."""
    if chunk[:1] != b":" and chunk[:11] != b"event: ping":
        return True
    for raw in chunk.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = parse_event(raw)
        if name is None and not data:
            continue  # comments, blank
        if name != "ping":
            return True
    return False
