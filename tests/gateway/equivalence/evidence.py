"""Which system prompt lines the traffic itself has shown to change (P4 (b)).

A line has changed when two requests of one family (the same API and requested model, the
same gateway key: the harness sends none) have system prompts of as many lines that differ
in that line alone. Such a line, in either version, may then move to the end; nothing else
counts as evidence. The record is kept per gateway, for as long as it runs (the gateway
remembers across tests too), and is generous about order: whatever was sent before a
request's answer is read counts, whether or not the gateway saw it first.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["Evidence", "system_lines"]

#: Recent distinct system prompts remembered a family (least recently seen forgotten first).
KEEP = 16


def system_lines(api: str, body: Any) -> tuple[str, ...] | None:
    """The lines of ``body``'s system prompt (OpenAI: the leading system and developer
    messages' texts; Anthropic: ``system``), None when it has none."""
    if not isinstance(body, dict):
        return None
    texts: list[str] = []
    if api == "anthropic":
        texts += _texts(body.get("system"))
    else:
        for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
            if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
                break
            texts += _texts(message.get("content"))
    return tuple(line for text in texts for line in text.split("\n")) if texts else None


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
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
        self._recent: dict[tuple[str, str], deque[tuple[str, ...]]] = {}
        self._changing: dict[tuple[str, str], set[str]] = {}

    def see(self, api: str, body: Any) -> None:
        """A request is being sent."""
        lines = system_lines(api, body)
        if lines is None or not isinstance(body.get("model"), str):
            return
        family = (api, body["model"])
        recent = self._recent.setdefault(family, deque(maxlen=KEEP))
        if lines in recent:  # seen again: the most recent (the gateway's memory is an LRU)
            recent.remove(lines)
            recent.append(lines)
            return
        for other in recent:
            if len(other) == len(lines):
                at = _one_difference(other, lines)
                if at is not None:
                    self._changing.setdefault(family, set()).update((other[at], lines[at]))
        recent.append(lines)

    def changing(self, api: str, body: Any) -> frozenset[str]:
        """The lines shown to change in ``body``'s family so far."""
        model = body.get("model") if isinstance(body, dict) else None
        return frozenset(self._changing.get((api, model), ())) if isinstance(model, str) \
            else frozenset()
