"""Observe and collect a Responses event stream (SSE), and render an answer as one. Pure,
no I/O.

- :class:`StreamObserver`: cuts an upstream's bytes into whole events and notes what logs
  and metrics need: ``done`` (``response.completed`` or ``response.incomplete`` seen),
  ``errored`` (``error`` or ``response.failed``) with its ``error_type``, ``finish_reason``
  (``stop``, ``tool_calls`` or ``length``) and ``usage`` (in chat's names).
- :func:`failure_event`: the ``response.failed`` ending a stream the upstream broke midway
  (the observer keeps the created response and the last ``sequence_number`` for it).
- :class:`AnswerCollector`: the cacheable answer, from the final response object.
- :func:`response_events`: an :class:`~gateway.formats.answer.Answer` (a cache hit) as the
  whole event stream, made by the chat-to-Responses stream translator from the answer's own
  chunk stream, so that a hit streams exactly as a translated answer does.

Wire format: https://platform.openai.com/docs/api-reference/responses-streaming
"""

from __future__ import annotations

import re
from typing import Any

from gateway.errors import GatewayError
from gateway.formats.answer import Answer
from gateway.formats.openai import completion_events
from gateway.formats.responses import answer_from_response
from gateway.formats.responses_to_openai.stream import ResponsesStreamFromChat
from gateway.formats.translator import load_object
from llm_wire.sse import cut_events, json_event, parse_event

__all__ = ["AnswerCollector", "StreamObserver", "error_event", "events_with", "failure_event",
           "final_response", "response_events"]

_END = {"response.completed": "stop", "response.incomplete": "length"}
_CALLS = ("function_call", "custom_tool_call")


def _usage(obj: dict[str, Any]) -> dict[str, Any] | None:
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details") or {}
    return {"prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
            "total_tokens": usage.get("total_tokens"),
            "prompt_tokens_details": {"cached_tokens": details.get("cached_tokens", 0)}}


#: What the observer reads: the ends of a stream (its other events are passed by unread),
#: found by their type (not by a word: every response object holds an ``"error"`` field).
_NOTED = re.compile(rb'"type":\s*"(?:response\.(?:completed|incomplete|failed)|error)"')
_FINAL = re.compile(rb"response\.(?:completed|incomplete)")
_COMPLETED = re.compile(rb"response\.completed")
_DELTA = b"event: response.output_text.delta\n"
_SEQUENCE = re.compile(rb'"sequence_number":\s*(\d+)')
_CREATED = re.compile(rb'"type":\s*"response\.created"')


def events_with(block: bytes, markers: re.Pattern[bytes]) -> list[tuple[str | None, bytes]]:
    """The events of a block of whole SSE events in which ``markers`` is found (their type
    is in the ``event:`` line and the data), parsed; the others (text deltas, the bulk of a
    stream) are not."""
    if block.startswith(_DELTA) and block.find(b"\n\n") == len(block) - 2:
        return []  # one text delta alone, as most blocks are: never an end
    if 13 in block:
        block = block.replace(b"\r\n", b"\n")
    out, end = [], 0
    for found in markers.finditer(block):  # (a block is cut only around what is found)
        at = found.start()
        if at < end:
            continue  # in the event just taken (its ``event:`` line and its data)
        start = block.rfind(b"\n\n", 0, at)
        start = 0 if start < 0 else start + 2
        end = block.find(b"\n\n", at)
        end = len(block) if end < 0 else end
        out.append(parse_event(block[start:end]))
    return out


def final_response(block: bytes, ends: re.Pattern[bytes] = _FINAL) -> dict[str, Any] | None:
    """The response object of the last ``response.completed`` (or ``response.incomplete``)
    event in a block of whole SSE events, or None."""
    found = None
    for _, data in events_with(block, ends):
        obj = load_object(data)
        if obj is not None and obj.get("type") in _END and isinstance(obj.get("response"), dict):
            found = obj["response"]
    return found


class StreamObserver:
    """See the module docstring; ``hide_usage_chunk`` is accepted for the shared interface
    (a Responses stream has no usage-only event to drop)."""

    __slots__ = ("_buf", "created", "done", "error_type", "errored",
                 "finish_reason", "sent", "usage")

    def __init__(self, hide_usage_chunk: bool = False) -> None:
        self._buf = b""
        self.sent = 0  # the next event's sequence_number (after the last one passed on)
        #: The response object of the stream's ``response.created`` (None before it).
        self.created: dict[str, Any] | None = None
        self.done = False
        self.errored = False
        self.error_type: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Take bytes from upstream; return the complete events to forward now, as they came
        (may be b"")."""
        block, self._buf = cut_events(self._buf + chunk)
        if block:
            at = block.rfind(b'"sequence_number":')
            if at >= 0:
                found = _SEQUENCE.match(block, at)
                if found:
                    self.sent = int(found[1]) + 1
            if self.created is None and b"response.created" in block:
                for _, data in events_with(block, _CREATED):
                    response = (load_object(data) or {}).get("response")
                    if isinstance(response, dict):
                        self.created = response
            self._observe(block)
        return block

    def flush(self) -> bytes:
        """What remains at the end of the stream (an unterminated last event, if any)."""
        rest, self._buf = self._buf, b""
        if not rest.strip():
            return b""
        self._observe(rest + b"\n\n")
        return rest + b"\n\n"

    def _observe(self, block: bytes) -> None:
        for name, data in events_with(block, _NOTED):
            obj = load_object(data) or {}
            kind = obj.get("type") or name
            if kind in _END:
                self.done = True
                response = obj.get("response") or {}
                self.usage = _usage(response) or self.usage
                calls = any(isinstance(i, dict) and i.get("type") in _CALLS
                            for i in response.get("output") or ())
                self.finish_reason = "tool_calls" if calls and kind == "response.completed" \
                    else _END[kind]
            elif kind in ("error", "response.failed"):
                self.errored = True
                error = obj.get("error") or (obj.get("response") or {}).get("error") or obj
                self.error_type = str(error.get("code") or error.get("type") or "error") \
                    if isinstance(error, dict) else "error"


class AnswerCollector:
    """Rebuilds the answer of a Responses stream from its final response object."""

    __slots__ = ("_final",)

    def __init__(self) -> None:
        self._final: dict[str, Any] | None = None

    def feed(self, events: bytes) -> None:
        """Take a block of whole SSE events."""
        final = final_response(events, _COMPLETED)
        if final is not None:
            self._final = final

    def answer(self, finish: str | None, usage: dict[str, Any] | None) -> Answer | None:
        """The whole answer (tool calls included only when the response carried them and
        the caller allows them: see :func:`~gateway.formats.responses.answer_from_response`);
        None without a completed response."""
        return answer_from_response(self._final, allow_tools=False)


def response_events(answer: Answer, body: dict[str, Any], id_: str) -> bytes:
    """``answer`` as the whole Responses event stream for the request ``body`` (one write:
    it is already complete)."""
    translator = ResponsesStreamFromChat(body)
    return translator.feed(completion_events(answer, True, id_)) + translator.flush()


def failure_event(observer: StreamObserver, error: GatewayError) -> bytes:
    """``response.failed`` ending a stream the upstream broke midway: the response the
    client saw created, ``status: "failed"`` and ``error`` (``server_error``, the message);
    the ``error`` event (:func:`error_event`) where no response was created yet."""
    if observer.created is None:
        return error_event(error)
    response = {**observer.created, "status": "failed",  # (the API's own error code: the
                "error": {"code": "server_error",           # gateway's is in its log line)
                          "message": error.as_dict().get("message")}}
    return json_event({"type": "response.failed", "sequence_number": observer.sent,
                       "response": response}, "response.failed")


def error_event(error: GatewayError) -> bytes:
    """``error`` as a Responses stream's ``error`` event (the openai SDK raises on it)."""
    inner = error.as_dict()
    return json_event({"type": "error", "sequence_number": 0, "code": inner.get("code"),
                       "message": inner.get("message"), "param": inner.get("param")}, "error")
