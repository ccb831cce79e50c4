"""A complete assistant answer in no wire format: what the response cache stores and serves.

Each wire format renders it (:mod:`gateway.formats.openai`: ``chat.completion`` JSON or a
chunk stream) and builds it from its own responses. Stored as compact JSON bytes with the
fields below, so entries written by one replica are read by any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway import jsonio

__all__ = ["Answer"]


@dataclass(frozen=True, slots=True)
class Answer:
    """``content``: the text (None for a pure tool call); ``tool_calls``: OpenAI-shaped
    tool calls or None; ``finish_reason``: ``stop`` or ``tool_calls`` (only complete answers
    are kept); ``model``: the upstream model that wrote it; token counts from its usage."""

    content: str | None
    finish_reason: str
    model: str
    tool_calls: list[dict[str, Any]] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def to_bytes(self) -> bytes:
        return orjson.dumps({
            "content": self.content, "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason, "model": self.model,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
        })

    @classmethod
    def from_bytes(cls, stored: bytes) -> Answer:
        """Raises ValueError (orjson.JSONDecodeError) or KeyError for a broken entry."""
        return cls.from_stored(jsonio.loads(stored))

    @classmethod
    def from_stored(cls, a: Any) -> Answer:
        """The answer of a stored entry already parsed (:meth:`to_bytes`'s fields). Raises
        KeyError or TypeError for a broken one."""
        return cls(a["content"], a["finish_reason"], a["model"], a.get("tool_calls") or None,
                   a.get("prompt_tokens"), a.get("completion_tokens"))

    @classmethod
    def complete(cls, content: Any, finish_reason: str, model: str,
                 tool_calls: Any, usage: dict[str, Any] | None,
                 allow_tools: bool) -> Answer | None:
        """The answer if it may be kept: finished (``stop``, or ``tool_calls`` when
        ``allow_tools``) and carrying text or tool calls; else None."""
        if tool_calls and not allow_tools:
            return None
        if finish_reason not in ("stop", "tool_calls") or (
                finish_reason == "tool_calls" and not allow_tools):
            return None
        if not isinstance(content, str) and not tool_calls:
            return None
        usage = usage or {}
        return cls(content if isinstance(content, str) else None, finish_reason, model,
                   tool_calls or None, usage.get("prompt_tokens"),
                   usage.get("completion_tokens"))
