"""Server-sent events as the OpenAI and Anthropic APIs frame them: the one event builder.

An event is ``data: <payload>\n\n`` (optionally preceded by ``event: <name>\n``, as
Anthropic's Messages stream names its events). OpenAI ends a stream with ``data: [DONE]``.
Spec: https://html.spec.whatwg.org/multipage/server-sent-events.html
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["DONE", "data_event", "json_event"]

#: The OpenAI stream terminator.
DONE = b"data: [DONE]\n\n"


def data_event(payload: bytes, name: str | None = None) -> bytes:
    """One event carrying ``payload`` (already serialised, a single line of JSON)."""
    if name is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"


def json_event(obj: Any, name: str | None = None) -> bytes:
    """One event carrying ``obj`` serialised with orjson."""
    return data_event(orjson.dumps(obj), name)
