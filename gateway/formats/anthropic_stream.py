"""Read an Anthropic Messages event stream (SSE) on its way through, without re-serialising it.

:class:`StreamObserver` cuts the upstream's bytes into whole events (so the client never gets
half an event from us) and notes what logs and metrics need: ``finish_reason``, ``usage``,
whether ``message_stop`` or an ``error`` event was seen. :class:`AnswerCollector` rebuilds a
plain text answer from the events forwarded, for the response cache. Both are exported by
:mod:`gateway.formats.anthropic`, which imports this module (never the other way round).

A stream is ``message_start``, per content block ``content_block_start`` /
``content_block_delta``... / ``content_block_stop``, one or more ``message_delta`` (stop
reason, cumulative usage), ``message_stop``; ``ping`` and ``error`` events may come anywhere.
Every event is named (``event: <type>``) and its data's ``type`` is the same name.
Wire format: https://docs.anthropic.com/en/docs/build-with-claude/streaming
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import orjson

from gateway.formats.answer import Answer
from gateway.formats.openai_stream import error_type_in
from llm_wire.sse import cut_events, parse_event

__all__ = ["AnswerCollector", "StreamObserver", "finish_reason_of"]

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop",
           "model_context_window_exceeded": "length"}


def finish_reason_of(stop_reason: str | None) -> str | None:
    """OpenAI's ``finish_reason`` for an Anthropic ``stop_reason`` (None stays None).
    Defined here, where the observer needs it; :mod:`gateway.formats.anthropic` exports it
    with its inverse, ``stop_reason_of``."""
    if stop_reason is None:
        return None
    return _FINISH.get(stop_reason, "stop")


class StreamObserver:
    """Cuts an upstream's bytes into whole events and notes ``done`` (``message_stop``
    seen), ``errored`` (an ``error`` event seen), ``finish_reason`` (OpenAI vocabulary, from
    the last ``message_delta``'s ``stop_reason``) and ``usage`` (Anthropic-shaped:
    ``message_start``'s ``message.usage`` updated by each ``message_delta``'s non-null
    counts, which are cumulative; None until seen).

    ``hide_usage_chunk`` is accepted and ignored: Anthropic streams have no usage-only
    event to hide, and both formats' observers are built the same way.
    """

    __slots__ = ("_buf", "done", "error_type", "errored", "finish_reason", "usage")

    def __init__(self, hide_usage_chunk: bool = False) -> None:
        self._buf = b""
        self.done = False
        self.errored = False
        self.error_type: str | None = None  # the error event's error.type
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Take bytes from upstream; return the complete events to forward now (may be b""),
        unchanged but for CRLF line ends, which become LF."""
        block, self._buf = cut_events(self._buf + chunk if self._buf else chunk)
        if not block:
            return b""
        # The bulk is content_block_delta events, never parsed: one alone (its name line, one
        # data line) names no other event, and a block that names neither a message_* event
        # nor an error is forwarded at once. (Text that merely contains those words costs a
        # look at each event's name, still no JSON parse.) (find, not ``in``: on Python 3.11
        # ``bytes in bytes`` first fails to read its operand as an int, which costs more than
        # the search.)
        if block[:_DELTA_HEAD_LEN] == _DELTA_HEAD and 10 not in block[_DELTA_HEAD_LEN:-2]:
            return block
        if block.find(b"message_") >= 0 or block.find(b"error") >= 0:
            self._observe(block)
        return block

    def flush(self) -> bytes:
        """What remains at the end of the stream (an unterminated last event, if any), with
        its terminating blank line."""
        rest, self._buf = self._buf.rstrip(b"\r\n"), b""
        if not rest.strip():
            return b""
        rest += b"\n\n"
        self._observe(rest)
        return rest

    def _observe(self, block: bytes) -> None:
        # Anthropic names every event, its name line first: the few that matter are found
        # by their name at a line's start (text that merely contains the words is inside a
        # data line's JSON, never at a line's start), and only their data is read.
        if not block.startswith(b"event: ") and b"\nevent: " not in block:
            self._observe_unnamed(block)
            return
        for marker in (b"event: message_", b"event: error\n"):
            at = block.find(marker)
            while at >= 0:
                if at == 0 or block[at - 1] == 10:
                    self._event_at(block, at)
                at = block.find(marker, at + 1)

    def _event_at(self, block: bytes, at: int) -> None:
        """The named event whose ``event:`` line starts at ``at``."""
        end = block.find(b"\n", at)
        name = block[at + 7:end]
        if name == b"message_stop":
            self.done = True
            return
        data = b""
        if block.startswith(b"data: ", end + 1):
            stop = block.find(b"\n", end + 1)
            data = block[end + 7:stop if stop >= 0 else len(block)]
            if stop >= 0 and block.startswith(b"data:", stop + 1):  # data on several lines
                last = block.find(b"\n\n", at)
                data = parse_event(block[at:last if last >= 0 else len(block)])[1]
        if name == b"error":
            self.errored = True
            self.error_type = error_type_in(data)
        elif name == b"message_start" or name == b"message_delta":
            self._note(name.decode(), data)

    def _observe_unnamed(self, block: bytes) -> None:
        """Events without an ``event:`` line (not Anthropic's own framing): by data type."""
        for raw in block.split(b"\n\n"):
            if b"message_" not in raw and b"error" not in raw:
                continue
            name, data = parse_event(raw)
            if name is None and data:
                name = _type_of(data)
            if name == "message_stop":
                self.done = True
            elif name == "error":
                self.errored = True
                self.error_type = error_type_in(data)
            elif name == "message_start" or name == "message_delta":
                self._note(name, data)

    def _note(self, name: str, data: bytes) -> None:
        """Read one message_start or message_delta event (a couple per stream)."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        if name == "message_start":
            message = obj.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self.usage = usage
            return
        delta = obj.get("delta")
        if isinstance(delta, dict) and delta.get("stop_reason") is not None:
            self.finish_reason = finish_reason_of(delta["stop_reason"])
        usage = obj.get("usage")
        if isinstance(usage, dict):
            merged = self.usage if self.usage is not None else {}
            merged.update((k, v) for k, v in usage.items() if v is not None)
            self.usage = merged


def _type_of(data: bytes) -> str | None:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    kind = obj.get("type") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else None


class AnswerCollector:
    """Rebuilds a plain text answer from a Messages event stream. A tool_use, thinking or
    any non-text block, an error event or anything unreadable makes it give up (streamed
    tool calls are not reassembled). The blocks of whole events are kept as they are sent
    (``feed`` is the list's own ``append``: no Python work per block on the relay's path)
    and read once, by :meth:`answer`."""

    __slots__ = ("_blocks", "broken", "content", "feed", "model", "started")

    def __init__(self) -> None:
        self._blocks: list[bytes] = []
        #: Take a block of whole SSE events (bytes as sent to the client).
        self.feed: Callable[[bytes], None] = self._blocks.append
        self.content: list[str] = []
        self.model = ""
        self.started = False
        self.broken = False

    def _read_all(self) -> None:
        """Read the blocks kept. Anthropic's own framing (each event one ``event:`` line and
        one ``data:`` line) is cut by one split of the whole stream into its lines; anything
        else is read event by event, block by block."""
        data = b"".join(self._blocks)
        lines = data.split(b"\n")
        if data.endswith(b"\n\n") and len(lines) % 3 == 1:
            names, datas, blanks = lines[0:-1:3], lines[1:-1:3], lines[2:-1:3]
            if blanks.count(b"") == len(blanks) \
                    and all(map(_EVENT_LINE, names)) and all(map(_DATA_LINE, datas)):
                for name, line in zip(names, datas, strict=True):
                    if name[7:] not in _UNREAD_NAMES and len(line) > 6:
                        self._read(line[6:])
                        if self.broken:  # for good: nothing read now could make an answer
                            return
                return
        for block in self._blocks:
            for raw in block.split(b"\n\n"):
                kind, event = parse_event(raw)
                if kind not in _UNREAD and event:
                    self._read(event)
                    if self.broken:
                        return

    def _read(self, data: bytes) -> None:
        """One event's data (the event not one of those left unread)."""
        # The bulk, a text delta as Anthropic writes it, has only its text parsed: what is
        # around the text is the prefix and suffix below, and the text one JSON string.
        if data[:_DELTA_LEN] == _DELTA and data[-2:] == b"}}":
            try:
                text = orjson.loads(data[_DELTA_LEN:-2])
            except orjson.JSONDecodeError:
                text = None
            if isinstance(text, str):
                self.content.append(text)
                return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.broken = True
            return
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta" \
                    and isinstance(delta.get("text"), str):
                self.content.append(delta["text"])
            else:
                self.broken = True
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict) and block.get("type") == "text" \
                    and isinstance(block.get("text"), str) and not block.get("citations"):
                self.content.append(block["text"])
            else:
                self.broken = True
        elif kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict) and not message.get("content"):
                self.model = str(message.get("model") or "")
                self.started = True
            else:
                self.broken = True
        elif kind not in _UNREAD:  # an error event, or something unknown
            self.broken = True

    def answer(self, finish: str | None, usage: dict[str, Any] | None) -> Answer | None:
        """The whole answer when it was plain text and ``finish`` (OpenAI vocabulary) is
        ``stop``, else None. ``usage``: OpenAI-shaped (``prompt_tokens``...) or None."""
        if finish != "stop":
            return None
        self._read_all()
        if self.broken or not self.started:
            return None
        return Answer.complete("".join(self.content), finish, self.model, None, usage, False)


# Events the collector need not read: their content is known from the name (or they carry
# what the observer notes: the stop reason and usage).
_UNREAD = frozenset({"ping", "content_block_stop", "message_delta", "message_stop"})
_UNREAD_NAMES = frozenset(name.encode() for name in _UNREAD)
#: A content_block_delta event's name line.
_DELTA_HEAD = b"event: content_block_delta\n"
_DELTA_HEAD_LEN = len(_DELTA_HEAD)
#: A text delta's data, up to its text (as Anthropic writes it).
_DELTA = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
_DELTA_LEN = len(_DELTA)
#: Whether a line is an event's name line, its data line.
_EVENT_LINE = operator.methodcaller("startswith", b"event: ")
_DATA_LINE = operator.methodcaller("startswith", b"data: ")

