"""Server-sent events as the OpenAI and Anthropic APIs frame them: the one event builder,
and the one reader.

An event is ``data: <payload>\n\n`` (optionally preceded by ``event: <name>\n``, as
Anthropic's Messages stream names its events). OpenAI ends a stream with ``data: [DONE]``.
Spec: https://html.spec.whatwg.org/multipage/server-sent-events.html
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["DONE", "Event", "EventReader", "data_event", "json_event", "parse_event"]

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
        buf = self._buf + chunk if self._buf else chunk
        if buf.find(13) >= 0:
            buf = buf.replace(b"\r\n", b"\n")
            if buf.endswith(b"\r"):  # a CR whose LF is in the next chunk
                buf, self._buf = buf[:-1], b"\r"
                return self._cut(buf, keep_cr=True)
        return self._cut(buf)

    def _cut(self, buf: bytes, keep_cr: bool = False) -> list[Event]:
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf + self._buf if keep_cr else buf
            return []
        rest = buf[end + 2:]
        self._buf = rest + self._buf if keep_cr else rest
        out = []
        for raw in buf[:end].split(b"\n\n"):
            event = parse_event(raw)
            if event[0] is not None or event[1]:
                out.append(event)
        return out

    def flush(self) -> list[Event]:
        rest, self._buf = self._buf, b""
        rest = rest.replace(b"\r", b"")
        if not rest.strip():
            return []
        return self._cut(rest + b"\n\n")
