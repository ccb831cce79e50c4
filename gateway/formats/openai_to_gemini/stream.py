"""An OpenAI client calling a Gemini upstream, streamed: ``streamGenerateContent?alt=sse``'s
events (each ``data:`` a whole GenerateContentResponse holding the next piece) become the
``chat.completion.chunk`` stream. Pure, no I/O.

    OpenAIStreamFromGemini(created=None).feed(chunk) -> bytes, .flush() -> bytes

- the first event -> the role chunk, ``delta: {"role": "assistant", "content": ""}``;
- each text part (``thought`` parts left out) -> ``delta: {"content": text}``;
- each ``functionCall`` part (Gemini sends a call whole) -> one ``tool_calls`` delta with
  its id, name and all its arguments (index counting calls from 0);
- the event with ``finishReason`` (Gemini's last: its stream has no other terminator) ->
  the finish chunk, the usage-only chunk (from its ``usageMetadata``; always sent, the
  gateway drops it for clients that did not ask) and ``data: [DONE]``; a blocked prompt
  (``promptFeedback.blockReason``, no candidate) ends the same way with ``content_filter``;
- ``{"error": {...}}`` -> ``data: {"error": {message, type, param: null, code}}``
  (:func:`gateway.formats.gemini.openai_error`); an event that is not JSON, an
  ``upstream_error``. A body that ends without a finish gets no terminator (broken).

Sources: https://ai.google.dev/api/generate-content#method:-models.streamgeneratecontent,
https://platform.openai.com/docs/api-reference/chat-streaming
"""

from __future__ import annotations

import time
from typing import Any

from gateway.formats.gemini import (
    candidate_parts,
    finish_reason_of,
    openai_error,
    usage_to_openai,
)
from gateway.formats.ids import random_hex
from gateway.formats.openai_stream import chunk_event, chunk_head
from gateway.formats.translator import INVALID_EVENT, EventTranslator, load_object
from llm_wire.errors import error_body
from llm_wire.sse import DONE, data_event, json_event

__all__ = ["OpenAIStreamFromGemini"]



class OpenAIStreamFromGemini(EventTranslator):
    """Gemini stream events in, OpenAI ``chat.completion.chunk`` events out (module
    docstring). ``created``: the chunks' ``created`` (Unix seconds; None: now)."""

    __slots__ = ("_base", "_calls", "_created", "_head", "id")

    def __init__(self, created: int | None = None) -> None:
        super().__init__()
        self._created = int(time.time()) if created is None else created
        self._head = b""  # a chunk's JSON up to its delta, set by the first event
        self._base: dict[str, Any] = {}
        self._calls = 0
        self.id = ""

    def _event(self, name: str | None, data: bytes) -> bytes:
        if not data:
            return b""
        obj = load_object(data)
        if obj is None:
            return self._fail("upstream_error", INVALID_EVENT)
        if isinstance(obj.get("error"), dict):
            code = obj["error"].get("code")
            _, error = openai_error(code if isinstance(code, int) else 500, obj)
            self.errored = True
            return json_event(error)
        out = b"" if self._head else self._start(obj)
        candidate, text, calls = candidate_parts(obj)
        if text:
            out += self._chunk({"content": text})
        for call in calls:
            out += self._chunk({"tool_calls": [{"index": self._calls, **call}]})
            self._calls += 1
        reason = candidate.get("finishReason") if candidate is not None else None
        feedback = obj.get("promptFeedback")
        if candidate is None and isinstance(feedback, dict) and feedback.get("blockReason"):
            reason = "SAFETY"
        if reason:
            self.done = True
            out += (self._chunk({}, finish_reason_of(reason, self._calls > 0))
                    + json_event({**self._base, "choices": [],
                                  "usage": usage_to_openai(obj.get("usageMetadata"))}) + DONE)
        return out

    def _start(self, obj: dict[str, Any]) -> bytes:
        id_ = obj.get("responseId")
        self.id = "chatcmpl-" + (id_ if isinstance(id_, str) and id_ else random_hex())
        self._base = {"id": self.id, "object": "chat.completion.chunk",
                      "created": self._created, "model": str(obj.get("modelVersion") or "")}
        self._head = chunk_head(self._base)
        return self._chunk({"role": "assistant", "content": ""})

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return chunk_event(self._head, delta, finish)

    def _fail(self, type_: str, message: str) -> bytes:
        self.errored = True
        return data_event(error_body(message, type_, type_))
