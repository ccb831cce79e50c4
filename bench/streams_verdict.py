"""How ``bench/streams.py`` reads and judges a stream the client got (pure): its SSE events,
its answer's text, and whether it arrived whole, ended with an explicit error, or was cut
silently.
"""

from __future__ import annotations

import orjson

__all__ = ["error_of", "parse_sse", "text_of", "verdict"]


def parse_sse(body: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE event in ``body``; comments and ``id:`` lines left out."""
    out: list[tuple[str | None, str]] = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = None, []
        for line in block.decode().split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if data:
            out.append((name, "\n".join(data)))
    return out


def text_of(api: str, events: list[tuple[str | None, str]]) -> str:
    """The answer's text in ``events`` (chat content deltas; Messages text deltas)."""
    parts = []
    for _, data in events:
        if data == "[DONE]":
            continue
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if api == "chat":
            for choice in obj.get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
        elif obj.get("type") == "content_block_delta" and obj["delta"]["type"] == "text_delta":
            parts.append(obj["delta"]["text"])
    return "".join(parts)


def verdict(api: str, status: int, events: list[tuple[str | None, str]], reference: str) -> str:
    """``whole`` (well formed, the reference text), ``error`` (an explicit error: an HTTP
    error, or an error event and no clean end) or ``silent`` (anything else: a truncation or
    a malformed stream the client could take for an answer)."""
    if status != 200:
        return "error"
    try:
        objs = [(name, None if data == "[DONE]" else orjson.loads(data)) for name, data in events]
    except orjson.JSONDecodeError:
        return "silent"  # a malformed event
    if api == "chat":
        errored = any(o is not None and "error" in o for _, o in objs)
        clean = bool(objs) and objs[-1][1] is None
        roles = sum(1 for _, o in objs if o and any("role" in (c.get("delta") or {})
                                                     for c in o.get("choices") or ()))
        ends = sum(1 for _, o in objs if o and any(c.get("finish_reason")
                                                    for c in o.get("choices") or ()))
    else:
        errored = any(n == "error" or (o or {}).get("type") == "error" for n, o in objs)
        clean = bool(objs) and (objs[-1][1] or {}).get("type") == "message_stop"
        roles = sum(1 for _, o in objs if (o or {}).get("type") == "message_start")
        ends = sum(1 for _, o in objs if (o or {}).get("type") == "message_delta"
                   and o["delta"].get("stop_reason"))
    if errored and not clean:
        return "error"
    whole = clean and not errored and roles == 1 and ends == 1
    return "whole" if whole and text_of(api, events) == reference else "silent"


def error_of(status: int, events: list[tuple[str | None, str]]) -> str:
    """An explicit error's code as the client read it (``http <status>`` for an HTTP error;
    the error event's ``code``, else its ``type``)."""
    if status != 200:
        return f"http {status}"
    for _, data in reversed(events):
        try:
            obj = orjson.loads(data) if data != "[DONE]" else None
        except orjson.JSONDecodeError:
            continue
        error = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(error, dict):
            return str(error.get("code") or error.get("type"))
    return "none"
