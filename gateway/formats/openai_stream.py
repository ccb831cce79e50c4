"""Observe an OpenAI chunk stream (SSE) on its way through, without re-serialising it.

:class:`StreamObserver` cuts the byte stream into whole events (so the client never gets
half an event from us) and notes what logs and metrics need: when the first event arrived,
``finish_reason``, ``usage``, whether ``[DONE]`` or an error event was seen. The only event
it may drop is the usage-only chunk (``"choices": []``) that the gateway itself asked for
when the client did not. Wire format: https://platform.openai.com/docs/api-reference/chat-streaming
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from llm_wire.sse import DONE, cut_events

__all__ = ["StreamObserver", "chunk_event", "chunk_head", "error_type_in"]

_FINISH = re.compile(rb'"finish_reason":\s*"([a-z_]+)"')
_DONE = DONE[:-2]  # b"data: [DONE]"
_DONE_LEN = len(DONE)


class StreamObserver:
    """Cuts an upstream's bytes into whole events and notes ``done`` (``[DONE]`` seen),
    ``errored`` (an error event seen) and its ``error_type``, ``finish_reason`` and
    ``usage``."""

    __slots__ = ("_buf", "_hide_usage", "done", "error_type", "errored", "finish_reason",
                 "usage")

    def __init__(self, hide_usage_chunk: bool = False):
        self._buf = b""
        self._hide_usage = hide_usage_chunk
        self.done = False
        self.errored = False
        self.error_type: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Take bytes from upstream; return the complete events to forward now (may be b"")."""
        block, self._buf = cut_events(self._buf + chunk if self._buf else chunk)
        if not block:
            return b""
        # A block ending with [DONE] (the whole rest of a stream, as a fast upstream sends it)
        # goes straight to the full look, which reads it from the end.
        if block[-_DONE_LEN:] == DONE:  # (a slice: endswith parses its arguments slowly)
            return self._observe(block)
        # The common block holds only content chunks, one line each plus the blank line, each
        # with "finish_reason":null (as OpenAI, vLLM and SGLang send them): two counts tell,
        # and nothing else is scanned. Anything else (a finish, usage, an error, [DONE], a
        # comment, multi-line data, spaced JSON) gets the full look.
        nulls = block.count(b'"finish_reason":null')
        if nulls == 1 and 10 not in block[:-2]:  # one such event alone (as counted below)
            return block
        if 2 * nulls == block.count(10):
            return block
        return self._observe(block)

    def flush(self) -> bytes:
        """What remains at the end of the stream (an unterminated last event, if any)."""
        rest, self._buf = self._buf, b""
        return self._observe(rest + b"\n\n") if rest.strip() else b""

    def _observe(self, block: bytes) -> bytes:
        # What is looked for sits at the end of a stream (the finish, then the usage chunk,
        # then [DONE]), so it is searched for from the end: a whole stream in one block costs
        # a few hundred bytes of scanning, not one pass over it per question.
        if block.endswith(DONE) or _DONE in block:
            self.done = True
        at = block.rfind(b'"finish_reason":"')
        if at < 0:
            at = block.rfind(b'"finish_reason": "')
        if at >= 0:
            m = _FINISH.match(block, at)
            if m:
                self.finish_reason = m.group(1).decode()
        at = block.find(b'data: {"error"')
        if at >= 0:
            self.errored = True
            end = block.find(b"\n", at)
            self.error_type = error_type_in(block[at + 6:end if end >= 0 else len(block)])
        at = block.rfind(b'"usage":{')
        if at < 0:
            at = block.rfind(b'"usage": {')
        if at >= 0:
            return self._take_usage(block, at)
        return block

    def _take_usage(self, block: bytes, at: int) -> bytes:
        """Note the ``usage`` of the event holding offset ``at`` (the block's last usage
        object: a server sending usage in every chunk sends running totals); drop that event
        when it is the usage-only chunk the gateway asked for. Only that one event is parsed."""
        start = block.rfind(b"\n\n", 0, at)
        start = 0 if start < 0 else start + 2
        end = block.find(b"\n\n", at)
        event = block[start:end]
        if not event.startswith(b"data: {"):
            return block
        try:
            obj = orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            return block
        if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
            if self._hide_usage and obj.get("choices") == []:
                return block[:start] + block[end + 2:]
        return block


def error_type_in(data: bytes) -> str | None:
    """``error.type`` of an error event's data (OpenAI's ``{"error": {...}}`` or Anthropic's
    ``{"type": "error", "error": {...}}``), or None."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    error = obj.get("error") if isinstance(obj, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


_OPEN_TAIL = b',"logprobs":null,"finish_reason":null}]}\n\n'


def chunk_head(base: dict[str, Any]) -> bytes:
    """The bytes every ``chat.completion.chunk`` of one answer starts with, from its ``base``
    (``id``, ``object``, ``created``, ``model``), up to its one choice's ``delta``."""
    return orjson.dumps(base)[:-1] + b',"choices":[{"index":0,"delta":'


def chunk_event(head: bytes, delta: dict[str, Any], finish: str | None = None) -> bytes:
    """One SSE event of an OpenAI chat stream (a translated one's): ``head``
    (:func:`chunk_head`), ``delta``, and ``finish`` as its choice's ``finish_reason``."""
    if finish is None:
        return b"data: " + head + orjson.dumps(delta) + _OPEN_TAIL
    return (b"data: " + head + orjson.dumps(delta)
            + b',"logprobs":null,"finish_reason":' + orjson.dumps(finish) + b"}]}\n\n")
