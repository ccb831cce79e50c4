"""What both directions of translation share (:mod:`gateway.formats.openai_to_anthropic`,
:mod:`gateway.formats.anthropic_to_openai`). Pure, no I/O.

- :class:`Translator`: what the bridge asks of a stream translator (``feed``, ``flush``,
  ``done``), and :class:`EventTranslator`, the base both stream translators build on: it is
  fed the upstream's raw bytes (cut anywhere, LF or CRLF line ends), cuts them into whole
  events and returns whole translated events: ``feed(chunk) -> bytes`` (b"" when nothing is
  complete yet), then ``flush() -> bytes`` at the end of the upstream body. ``done`` turns
  True once the terminal event (``[DONE]`` / ``message_stop``) was emitted, and only when the
  upstream sent its own terminator: a stream cut short gets no terminator, so the gateway
  can report it as broken. An upstream error event (or an event that is not JSON, or out of
  order) becomes the caller's error event and sets ``errored``; nothing is emitted after it.
  Nothing is raised.
- :func:`tool_use_id`: an OpenAI tool call id made acceptable to Anthropic, the same way in
  a request, a whole answer and a stream, so that a call and its result still match.

Wire formats: https://platform.openai.com/docs/api-reference/chat-streaming,
https://docs.anthropic.com/en/docs/build-with-claude/streaming,
https://docs.anthropic.com/en/api/messages (``tool_use.id``: ``^[a-zA-Z0-9_-]+$``)
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import orjson

from gateway.formats.ids import random_hex
from llm_wire.sse import Event, EventReader

__all__ = ["INVALID_EVENT", "ChunkTranslator", "EventTranslator", "Translator", "load_object",
           "tool_use_id"]

#: The message of the error event that replaces an upstream event that cannot be read.
INVALID_EVENT = "upstream sent an invalid stream event"

_BAD_ID = re.compile(r"[^a-zA-Z0-9_-]")


def tool_use_id(call_id: Any) -> str:
    """An id Anthropic accepts (``^[a-zA-Z0-9_-]+$``) for an OpenAI tool call id: some
    servers write ``functions.get_weather:0``. The same id always gives the same answer, so a
    tool call and its result still match; a missing id gets a new one."""
    if not isinstance(call_id, str) or not call_id:
        return "toolu_" + random_hex()
    return _BAD_ID.sub("_", call_id)


def load_object(data: bytes) -> dict[str, Any] | None:
    """An event's data as a JSON object; None when it is not JSON or not an object."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class Translator(Protocol):
    """A stream translator as the bridge drives it (see :class:`EventTranslator`)."""

    @property
    def done(self) -> bool: ...

    @property
    def early(self) -> bytes: ...

    def head(self, model: str) -> bytes: ...

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class EventTranslator:
    """Cuts the upstream's bytes into events and hands each to ``_event`` until the stream
    ends (``done``) or fails (``errored``). Subclasses implement ``_event(name, data) ->
    bytes``: the translated events for one upstream event (b"" for none)."""

    __slots__ = ("_reader", "done", "early", "errored")

    def __init__(self) -> None:
        self._reader = EventReader()
        self.done = False
        self.errored = False
        #: The opening events :meth:`head` made (b"": none), which the stream's first
        #: output must begin with (:class:`gateway.formats.bridge.TranslatedStream`).
        self.early = b""

    def head(self, model: str) -> bytes:
        """The client's opening events, made before the upstream sent any (it accepted
        the stream): ``model``, the model asked of it. b"" where the client's format opens
        with nothing the upstream's first event is needed for. Made once; later calls return
        the same bytes, and the first event then opens nothing again."""
        return b""

    def feed(self, chunk: bytes) -> bytes:
        """Take upstream bytes; return the translated events completed so far (may be b"")."""
        if self.done or self.errored:
            return b""
        return self._translate(self._reader.feed(chunk))

    def flush(self) -> bytes:
        """At the end of the upstream body: what its unterminated last event translates to.
        Never a terminator the upstream did not send."""
        if self.done or self.errored:
            return b""
        return self._translate(self._reader.flush())

    def _translate(self, events: list[Event]) -> bytes:
        out = []
        for name, data in events:
            piece = self._event(name, data)
            if piece:
                out.append(piece)
            if self.done or self.errored:
                break
        return b"".join(out)

    def _event(self, name: str | None, data: bytes) -> bytes:
        raise NotImplementedError


class ChunkTranslator(EventTranslator):
    """The base of the translators that read an OpenAI-style upstream's
    ``chat.completion.chunk`` events (into Anthropic's events, into Responses' events).

    It reads each event once: ``[DONE]`` -> ``_end()``; an event that is not a JSON object
    -> ``_fail(_invalid_type, INVALID_EVENT)``; an error (an ``error`` event, ``{"error":
    ...}``, or vLLM's ``{"object": "error", ...}``) -> ``_error(obj)``; otherwise the first
    chunk -> ``_start(chunk)`` (which sets ``_started``), a usage object ->
    ``_take_usage(usage)``, and for choice 0 each content piece -> ``_text(text)``, each tool
    call delta -> ``_tool(call)``, its ``finish_reason`` into ``_finish``. Other choices
    (n > 1), empty content, ``refusal`` and ``reasoning_content`` deltas are dropped."""

    __slots__ = ("_finish", "_started")
    #: The error type or code reported for an event that cannot be read.
    _invalid_type = "api_error"

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._finish: str | None = None

    def _event(self, name: str | None, data: bytes) -> bytes:
        if data == b"[DONE]":
            return self._end()
        if not data:
            return b""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is not dict:  # (orjson makes plain dicts)
            return self._fail(self._invalid_type, INVALID_EVENT)
        if name == "error" or obj.get("error") or obj.get("object") == "error":
            return self._error(obj)
        # (bytes added up rather than a list joined: an event makes one piece or two)
        out = b"" if self._started else self._start(obj)
        usage = obj.get("usage")
        if usage is not None and isinstance(usage, dict):
            self._take_usage(usage)
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                text = delta.get("content")
                if text and isinstance(text, str):
                    out += self._text(text)
                calls = delta.get("tool_calls")
                if calls:
                    for call in calls:
                        if isinstance(call, dict):
                            out += self._tool(call)
            finish = choice.get("finish_reason")
            if finish:
                self._finish = str(finish)
        return out

    def _start(self, chunk: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _take_usage(self, usage: dict[str, Any]) -> None:
        raise NotImplementedError

    def _text(self, text: str) -> bytes:
        raise NotImplementedError

    def _tool(self, call: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _end(self) -> bytes:
        raise NotImplementedError

    def _error(self, obj: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _fail(self, type_: str, message: str) -> bytes:
        raise NotImplementedError
