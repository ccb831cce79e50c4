"""One request's prompt-cache plan, and the function that shapes each upstream's body.

:class:`Settings` is built once per policy load (the patterns compiled). Per request,
:class:`Shaping` first reads the client's system prompt once, whatever its API: its lines'
fingerprints are compared with the family's recent requests
(:meth:`~gateway.prompt_cache.memory.PromptMemory.changed_lines`: the key and the requested
model) for lines seen to change. Then, called by dispatch once per target with the body in
the upstream's format (after any translation), it applies what the policy enables, in this
order:

- **anthropic**: tools sorted (:mod:`~gateway.prompt_cache.canonical`), volatile lines moved
  to the end of the last user turn (:mod:`~gateway.prompt_cache.volatile` says which,
  :mod:`~gateway.prompt_cache.relocate` moves them), cache markers placed
  (:mod:`~gateway.prompt_cache.breakpoints`), keys in the order tools, system, messages;
- **openai** (OpenAI-compatible servers and the local engine): tools sorted, volatile lines
  moved to the end of the last message, and ``prompt_cache_key`` set unless the client set
  one (its own, already namespaced by its key at the door): ``gw-`` + 16 hex digits of an
  HMAC under the deployment's secret over the gateway key's id, the static prefix (tools
  and leading system messages) and the conversation's opening message, as sent
  (:mod:`~gateway.prompt_cache.cache_keys`), so a conversation's turns are routed to the
  OpenAI cache machine holding its history
  (https://platform.openai.com/docs/guides/prompt-caching), and no other key can send it.
  The local engine ignores fields it does not know, so it is sent there too;
- **responses** (a Responses request to an upstream serving it natively): tools sorted and
  ``prompt_cache_key`` set likewise (its static prefix: tools, ``instructions``, the leading
  system and developer items; then the opening item); nothing moved. A Responses request translated for a chat
  upstream is shaped as **openai** or **anthropic**, after translation.

What it did goes into the log line (``prompt_cache_breakpoints``, ``prompt_cache_moved``:
counts by kind, never text); :meth:`Shaping.commit` remembers the prefixes it asked Anthropic
to cache, once the request went through.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.formats.chat_text import leading_messages, opening_message
from gateway.prompt_cache import canonical, relocate
from gateway.prompt_cache.breakpoints import Placed, Ttl, min_tokens_for, place
from gateway.prompt_cache.cache_keys import CacheKeys
from gateway.prompt_cache.converse import cache_points
from gateway.prompt_cache.memory import PromptMemory
from gateway.prompt_cache.volatile import (
    ClassifyLine,
    Cut,
    Detector,
    Moved,
    fingerprints,
    plan,
)
from gateway.requestlog import RequestRecord

__all__ = ["Settings", "Shaping"]


@dataclass(frozen=True, slots=True)
class Settings:
    """The policy's ``[prompt_cache]``, ready to use. ``detector`` is None when volatile
    lines stay where they are."""

    detector: Detector | None
    detect_changes: bool
    sort_tools: bool
    breakpoints: bool
    openai_cache_key: bool
    ttl: Ttl
    min_tokens: dict[str, int]
    default_min_tokens: int
    lookback_blocks: int


class Shaping:
    """One request's shaping: built by the stage, called by dispatch once per target as
    ``shaping(body, upstream_api) -> body``."""

    __slots__ = ("_changed", "_cuts", "_key", "_keys", "_memory", "_opening", "_placed",
                 "_record", "_settings", "_still")

    def __init__(self, settings: Settings, memory: PromptMemory, keys: CacheKeys,
                 record: RequestRecord, key_id: str | None, model: str, body: dict[str, Any],
                 api: str) -> None:
        self._settings = settings
        self._memory = memory
        self._keys = keys
        self._record = record
        self._key = key_id
        self._cuts: dict[tuple[str, ...], dict[str, Cut]] = {}
        self._placed: Placed | None = None
        self._changed: frozenset[int] = frozenset()
        self._still = False  # this system prompt was seen before, every line alike
        self._opening = opening_message(
            body.get("input" if api == "responses" else "messages")) \
            if settings.openai_cache_key else None  # read only for a derived cache key
        if settings.detector is not None and settings.detect_changes:
            texts = relocate.system_texts(body, api)
            if texts:
                self._changed, self._still = memory.recall((key_id, model),
                                                           fingerprints(texts))

    def plan(self, texts: list[str]) -> dict[str, Cut]:
        """The volatile lines of a system prompt's ``texts`` (planned once per request for
        the same texts: a retry, or another target of the same API)."""
        done = self._cuts.get(tuple(texts))
        if done is None:
            assert self._settings.detector is not None
            kind: ClassifyLine = self._settings.detector.kind
            if self._still:  # a metadata line seen holding still stays; the operator's move
                kind = _custom_only(kind)
            done = self._cuts[tuple(texts)] = plan(texts, kind, self._changed)
        return done

    def __call__(self, body: dict[str, Any], api: str) -> dict[str, Any]:
        if api == "gemini":  # Gemini caches a repeated prefix by itself: no marker, no key
            return body
        if api == "anthropic":
            return self._anthropic(body)
        if api == "responses":
            return self._responses(body)
        if api == "converse":  # Bedrock's Converse: its cachePoint blocks, nothing moved
            self._placed = None
            out, added = cache_points(body) if self._settings.breakpoints else (body, 0)
            self._log(added, ())
            return out
        return self._openai(body)

    def _anthropic(self, body: dict[str, Any]) -> dict[str, Any]:
        settings = self._settings
        out = self._tools(body)
        moved: list[Moved] = []
        if settings.detector is not None:
            out, moved = relocate.anthropic(out, self.plan)
        self._placed = None
        if settings.breakpoints:
            memory, key = self._memory, self._key
            out, self._placed = place(
                out, ttl=settings.ttl, lookback=settings.lookback_blocks,
                min_tokens=min_tokens_for(str(out.get("model", "")), settings.min_tokens,
                                          settings.default_min_tokens),
                seen=lambda prefix: memory.last_seen(key, prefix), now=memory.clock())
        out = canonical.anthropic_order(relocate.anthropic_append(out, moved))
        self._log(self._placed.added if self._placed else 0, moved)
        return out

    def _openai(self, body: dict[str, Any]) -> dict[str, Any]:
        settings = self._settings
        out = self._tools(body)
        moved: list[Moved] = []
        if settings.detector is not None:
            out, moved = relocate.openai(out, self.plan)
        if settings.openai_cache_key and out.get("prompt_cache_key") is None:
            out["prompt_cache_key"] = self._cache_key(out.get("tools"),
                                                      leading_messages(out.get("messages")))
        self._placed = None
        self._log(0, moved)
        return out

    def _responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """A Responses body, to an upstream serving it natively: tools sorted and
        ``prompt_cache_key`` set (its static prefix: tools, ``instructions`` and the leading
        system and developer items); volatile lines stay where the client put them."""
        out = self._tools(body)
        if self._settings.openai_cache_key and out.get("prompt_cache_key") is None:
            items = out.get("input")
            leading = leading_messages(items) if isinstance(items, list) else []
            out["prompt_cache_key"] = self._cache_key(out.get("tools"),
                                                      [out.get("instructions"), *leading])
        self._placed = None
        self._log(0, ())
        return out

    def _tools(self, body: dict[str, Any]) -> dict[str, Any]:
        out = dict(body)
        tools = body.get("tools")
        if self._settings.sort_tools and isinstance(tools, list) and tools:
            out["tools"] = canonical.tools(tools)
        return out

    def _cache_key(self, tools: Any, static: list[Any]) -> str:
        """The conversation's key: its static prefix and its opening message, as the client
        sent it (OpenAI routes by prefix and key to one cache machine, and spreads a prefix
        and key sent more than ~15 times a minute over more: one key per conversation keeps
        each conversation's turns on the machine holding its history)."""
        return self._keys.derived(self._key, tools, [*static, self._opening])

    def _log(self, added: int, moved: Sequence[Moved]) -> None:
        kinds = Counter(m.kind for m in moved)
        self._record.prompt_cache_breakpoints = added
        self._record.prompt_cache_moved = dict(sorted(kinds.items()))

    def commit(self) -> None:
        """The request went through: remember the prefixes it asked Anthropic to cache."""
        if self._placed is not None and self._placed.prefixes:
            self._memory.remember(self._key, self._placed.prefixes)


def _custom_only(kind: ClassifyLine) -> ClassifyLine:
    """``kind`` with only the operator's patterns (``custom``) left."""
    def custom(line: str) -> str | None:
        found = kind(line)
        return found if found == "custom" else None
    return custom
