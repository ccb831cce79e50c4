"""Which system prompt lines the traffic itself has shown to change (P4 (b)).

A line has changed when two requests of one family (the same requested model and gateway
key, whatever the client's API: the harness sends no key, and the gateway's prompt memory
keys a family so) have system prompts of as many lines that differ in that line alone. Such
a line, in either version, may then move to the end; nothing else counts as evidence. The
record is kept per gateway, for as long as it runs (the gateway remembers across tests
too), and is generous about order: whatever was sent before a request's answer is read
counts, whether or not the gateway saw it first.

The system prompt is read as the prompt_cache stage reads it: Anthropic's ``system`` text
blocks the client did not mark; OpenAI's leading system and developer messages (strings or
text parts); a Responses request's the same in its chat view (``instructions`` first); its
texts' lines in order, a separator between two texts. Every request sent counts, those the
gateway refused too (it never saw them): the window of recent prompts is kept wide
(:data:`KEEP`) so that the fuzz's many refused variants do not push out the prompts the
gateway still remembers.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from gateway.errors import GatewayError
from gateway.formats.responses import chat_view

__all__ = ["Evidence", "system_lines"]

#: Recent distinct system prompts remembered a family and line count (least recently seen
#: forgotten first; the gateway remembers 4 a family, of the requests it served).
KEEP = 64


def system_lines(api: str, body: Any) -> tuple[str, ...] | None:
    """The lines of ``body``'s system prompt (see the module docstring), None when it has
    none (or ``body`` is not one the gateway could read)."""
    if not isinstance(body, dict):
        return None
    texts: list[str] = []
    if api == "anthropic":
        texts += _texts(body.get("system"), marked=False)
    else:
        if api == "responses":
            try:
                body = chat_view(body)
            except (GatewayError, KeyError, TypeError, AttributeError, ValueError):  # refused
                return None
        for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
            if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
                break
            texts += _texts(message.get("content"), marked=True)
    lines: list[str] = []
    for i, text in enumerate(texts):
        if i:
            lines.append(f"\0text {i}")
        lines += text.split("\n")
    return tuple(lines) if lines else None


def _texts(content: Any, marked: bool) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                and isinstance(b.get("text"), str) and (marked or "cache_control" not in b)]
    return []


def _one_difference(a: tuple[str, ...], b: tuple[str, ...]) -> int | None:
    """The index of the one line where ``a`` and ``b`` differ; None for none or several."""
    found = None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            if found is not None:
                return None
            found = i
    return found


class Evidence:
    def __init__(self) -> None:
        self._recent: dict[tuple[str, int], deque[tuple[str, ...]]] = {}
        self._changing: dict[str, set[str]] = {}

    def see(self, api: str, body: Any) -> None:
        """A request of ``api`` (``openai``, ``anthropic``, ``responses``) is being sent."""
        if api not in ("openai", "anthropic", "responses"):
            return  # count_tokens: no prompt_cache stage
        lines = system_lines(api, body)
        if lines is None or not isinstance(body.get("model"), str):
            return
        model = body["model"]
        recent = self._recent.setdefault((model, len(lines)), deque(maxlen=KEEP))
        if lines in recent:  # seen again: the most recent (the gateway's memory is an LRU)
            recent.remove(lines)
            recent.append(lines)
            return
        for other in recent:
            at = _one_difference(other, lines)
            if at is not None:
                self._changing.setdefault(model, set()).update((other[at], lines[at]))
        recent.append(lines)

    def changing(self, api: str, body: Any) -> frozenset[str]:
        """The lines shown to change in ``body``'s family so far."""
        model = body.get("model") if isinstance(body, dict) else None
        return frozenset(self._changing.get(model, ())) if isinstance(model, str) \
            else frozenset()
