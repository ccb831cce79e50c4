"""One request's prompt-cache plan, and the function that shapes each upstream's body.

:class:`Settings` is built once per policy load (the patterns compiled). Per request,
:class:`Shaping` first reads the client's body once, whatever its API: the static texts
(system prompt, tool descriptions) are scanned for volatile spans, and their remaining
lines' fingerprints compared with the family's recent requests
(:meth:`~gateway.prompt_cache.memory.PromptMemory.changed_lines`: the key and the requested
model). Then, called by dispatch for each attempt with the body in the upstream's format
(after any translation), it applies what the policy enables, in this order:

- **anthropic**: tools sorted (:mod:`~gateway.prompt_cache.canonical`), volatile text out
  (:mod:`~gateway.prompt_cache.relocate`), cache markers placed
  (:mod:`~gateway.prompt_cache.breakpoints`), the notes appended after the rolling marker,
  keys in the order tools, system, messages;
- **openai** (OpenAI-compatible servers and the local engine): tools sorted, volatile text
  out and appended as a final user message, and ``prompt_cache_key`` set unless the client
  set one: ``gw-`` + 16 hex digits of BLAKE2b over the gateway key's id and the static prefix
  (tools and leading system messages, as sent), so requests sharing a prefix are routed to
  the same OpenAI cache machine (https://platform.openai.com/docs/guides/prompt-caching).
  The local engine ignores fields it does not know, so it is sent there too.

What it did goes into the log line (``prompt_cache_breakpoints``, ``prompt_cache_moved``:
counts by kind, never text); :meth:`Shaping.commit` remembers the prefixes it asked Anthropic
to cache, once the request went through.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.prompt_cache import canonical
from gateway.prompt_cache.breakpoints import Placed, Ttl, min_tokens_for, place
from gateway.prompt_cache.memory import PromptMemory
from gateway.prompt_cache.relocate import (
    Note,
    anthropic_append,
    anthropic_relocate,
    openai_append,
    openai_relocate,
)
from gateway.prompt_cache.volatile import Detector, Moved, Scan, line_hashes, scan, take_lines
from gateway.requestlog import RequestRecord

__all__ = ["Settings", "Shaping", "static_texts"]


@dataclass(frozen=True, slots=True)
class Settings:
    """The policy's ``[prompt_cache]``, ready to use. ``detector`` is None when volatile
    text stays where it is."""

    detector: Detector | None
    detect_changes: bool
    sort_tools: bool
    breakpoints: bool
    openai_cache_key: bool
    ttl: Ttl
    min_tokens: dict[str, int]
    default_min_tokens: int
    lookback_blocks: int


def static_texts(body: dict[str, Any], api: str) -> list[tuple[str, str]]:
    """``(source, text)`` of a chat body's static prefix in either API: the system prompt's
    texts in order (OpenAI: the leading system and developer messages), then each tool's
    description, tools by name."""
    texts: list[tuple[str, str]] = []
    if api == "anthropic":
        system = body.get("system")
        texts.extend(("system", t) for t in _texts(system))
    else:
        for message in body.get("messages") or ():
            if not isinstance(message, dict) or message.get("role") not in ("system",
                                                                              "developer"):
                break
            texts.extend(("system", t) for t in _texts(message.get("content")))
    described = []
    for tool in body.get("tools") or ():
        holder = tool.get("function", tool) if isinstance(tool, dict) else None
        description = holder.get("description") if isinstance(holder, dict) else None
        if isinstance(description, str):
            described.append((f"tool:{canonical.tool_name(tool)}", description))
    texts.extend(sorted(described))
    return texts


class Shaping:
    """One request's shaping: built by the stage, called by dispatch per attempt as
    ``shaping(body, upstream_api) -> body``."""

    __slots__ = ("_flagged", "_key", "_memory", "_placed", "_record", "_scans", "_settings")

    def __init__(self, settings: Settings, memory: PromptMemory, record: RequestRecord,
                 key_id: str | None, model: str, body: dict[str, Any], api: str) -> None:
        self._settings = settings
        self._memory = memory
        self._record = record
        self._key = key_id
        self._scans: dict[str, Scan] = {}
        self._placed: Placed | None = None
        self._flagged: frozenset[int] = frozenset()
        if settings.detector is not None:
            texts = static_texts(body, api)
            fingerprints: list[int] = []
            for source, text in texts:
                fingerprints.extend(line_hashes(source, self._scan(text).lines))
            if settings.detect_changes and fingerprints:
                self._flagged = memory.changed_lines((key_id, model), fingerprints)

    def _scan(self, text: str) -> Scan:
        done = self._scans.get(text)
        if done is None:
            assert self._settings.detector is not None
            done = self._scans[text] = scan(text, self._settings.detector)
        return done

    def relocate(self, source: str, text: str) -> tuple[str, list[Moved]]:
        """``text`` (from ``source``: ``system`` or ``tool:NAME``) without its volatile
        parts, and what left it."""
        found = self._scan(text)
        if self._flagged:
            lines, changed = take_lines(source, found.lines, self._flagged)
            if changed:
                return "\n".join(lines), [*found.moved, *changed]
        if not found.moved:
            return text, []
        return "\n".join(found.lines), list(found.moved)

    def __call__(self, body: dict[str, Any], api: str) -> dict[str, Any]:
        if api == "anthropic":
            return self._anthropic(body)
        return self._openai(body)

    def _anthropic(self, body: dict[str, Any]) -> dict[str, Any]:
        settings = self._settings
        out = self._tools(body)
        notes: list[Note] = []
        if settings.detector is not None and _has_user_turn(out):
            out, notes = anthropic_relocate(out, self.relocate)
        self._placed = None
        if settings.breakpoints:
            memory, key = self._memory, self._key
            out, self._placed = place(
                out, ttl=settings.ttl, lookback=settings.lookback_blocks,
                min_tokens=min_tokens_for(str(out.get("model", "")), settings.min_tokens,
                                          settings.default_min_tokens),
                seen=lambda prefix: memory.last_seen(key, prefix), now=memory.clock())
        out = canonical.anthropic_order(anthropic_append(out, notes))
        self._log(self._placed.added if self._placed else 0, notes)
        return out

    def _openai(self, body: dict[str, Any]) -> dict[str, Any]:
        settings = self._settings
        out = self._tools(body)
        notes: list[Note] = []
        if settings.detector is not None:
            out, notes = openai_relocate(out, self.relocate)
            out = openai_append(out, notes)
        if settings.openai_cache_key and out.get("prompt_cache_key") is None:
            out["prompt_cache_key"] = self._cache_key(out)
        self._placed = None
        self._log(0, notes)
        return out

    def _tools(self, body: dict[str, Any]) -> dict[str, Any]:
        out = dict(body)
        tools = body.get("tools")
        if self._settings.sort_tools and isinstance(tools, list) and tools:
            out["tools"] = canonical.tools(tools)
        return out

    def _cache_key(self, body: dict[str, Any]) -> str:
        static: list[Any] = []
        for message in body.get("messages") or ():
            if not isinstance(message, dict) or message.get("role") not in ("system",
                                                                              "developer"):
                break
            static.append(message)
        digest = hashlib.blake2b((self._key or "").encode(), digest_size=8)
        digest.update(b"\0")
        digest.update(orjson.dumps([body.get("tools"), static]))
        return "gw-" + digest.hexdigest()

    def _log(self, added: int, notes: Sequence[Note]) -> None:
        kinds = Counter(kind for _, moved in notes for kind in moved.kinds)
        self._record.prompt_cache_breakpoints = added
        self._record.prompt_cache_moved = dict(sorted(kinds.items()))

    def commit(self) -> None:
        """The request went through: remember the prefixes it asked Anthropic to cache."""
        if self._placed is not None and self._placed.prefixes:
            self._memory.remember(self._key, self._placed.prefixes)


def _texts(content: Any) -> list[str]:
    """The texts of a string or a list of text blocks (parts)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]


def _has_user_turn(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") == "user" for m in messages)
