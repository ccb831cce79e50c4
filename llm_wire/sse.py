"""Server-sent events as the OpenAI and Anthropic APIs frame them: the one event builder,
and the one reader.

An event is ``data: <payload>\n\n`` (optionally preceded by ``event: <name>\n``, as
Anthropic's Messages stream names its events). OpenAI ends a stream with ``data: [DONE]``.
Spec: https://html.spec.whatwg.org/multipage/server-sent-events.html
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["DONE", "Event", "EventReader", "cut_events", "data_event", "json_event",
           "parse_event"]

#: The OpenAI stream terminator.
DONE = b"data: [DONE]\n\n"

#: One parsed event: its name (None when it has no ``event:`` line) and its data (the
#: ``data:`` lines joined with newlines, b"" when it has none).
Event = tuple[str | None, bytes]


def data_event(payload: bytes, name: str | None = None) -> bytes:
    """One event carrying ``payload`` (already serialised, a single line of JSON)."""
    if name is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"


def json_event(obj: Any, name: str | None = None) -> bytes:
    """One event carrying ``obj`` serialised with orjson."""
    return data_event(orjson.dumps(obj), name)


def cut_events(buf: bytes) -> tuple[bytes, bytes]:
    """``buf`` (bytes as they arrived) split into its whole events, still bytes and with LF
    line ends (CRLF becomes LF), and the unfinished rest: ``(block, rest)``, either may be
    b"". For relays that forward events without parsing them."""
    # (An int's ``in`` and a slice's comparison: on Python 3.11, ``find``, ``rfind`` and
    # ``endswith`` parse their arguments the slow way, ~1k instructions a call, and
    # ``bytes in bytes`` first fails to read its operand as an int, ~2k.)
    if 13 in buf:  # CRLF framing (allowed by the spec; OpenAI and Anthropic send LF)
        buf = buf.replace(b"\r\n", b"\n")
    if buf[-2:] == b"\n\n":  # the common case: whole events only
        return buf, b""
    end = buf.rfind(b"\n\n") + 2
    if end < 2:
        return b"", buf
    if end == len(buf):
        return buf, b""
    return buf[:end], buf[end:]


def parse_event(raw: bytes) -> Event:
    """The name and data of one event's text (without its blank line). Comment lines
    (``:``...) and fields other than ``event`` and ``data`` are skipped; one space after the
    colon is dropped, as the spec says."""
    name: str | None = None
    data: list[bytes] = []
    for line in raw.split(b"\n"):
        if not line or line[0] == 58:  # b":": a comment (a keep-alive)
            continue
        field, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode("utf-8", "replace")
    return name, b"\n".join(data)


class EventReader:
    """Cuts a byte stream (chunk boundaries anywhere, LF or CRLF line ends) into whole events.

    ``feed(chunk)`` returns the events completed by ``chunk``, parsed (:func:`parse_event`);
    ``flush()`` those left at the end of the stream (an unterminated last event). Events with
    neither a name nor data (comments, keep-alives) are dropped.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[Event]:
        if not self._buf and chunk[:6] == b"data: " and chunk.find(10) == len(chunk) - 2 \
                and chunk[-1] == 10:  # one whole data-only event, as OpenAI streams arrive
            return [(None, chunk[6:-2])]
        block, self._buf = cut_events(self._buf + chunk if self._buf else chunk)
        return _parse_block(block) if block else []

    def flush(self) -> list[Event]:
        rest, self._buf = self._buf.replace(b"\r", b""), b""
        return _parse_block(rest) if rest.strip() else []


def _parse_block(block: bytes) -> list[Event]:
    out: list[Event] = []
    for raw in block.split(b"\n\n"):
        if raw[:6] == b"data: " and len(raw) > 6 and 10 not in raw:
            out.append((None, raw[6:]))  # one data line, as OpenAI streams send each event
            continue
        event = parse_event(raw)
        if event[0] is not None or event[1]:
            out.append(event)
    return out
