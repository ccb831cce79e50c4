"""A conversation's tier, kept across its turns: a routed conversation starts on the tier its
first turn scores, may rise to the strong tier once a later turn scores strong, and never
drops back while it lasts.

Why: a provider's prompt cache is per model. A conversation that changes model between turns
sends its whole history uncached to the new one (Anthropic writes it again at 1.25x the input
price), so per-turn routing of agent turns costs more latency than the weak tier saves
(bench/workload.py: every-stage agent turns TTFT p50 696 ms against 586 ms unrouted).
Rising once costs one such miss; dropping back would pay it on every easy turn.

A conversation is named by its gateway key, the router, and a fingerprint of what its turns
share: the tools, the leading system messages and the opening message (the same parts that
name an OpenAI ``prompt_cache_key``, :mod:`gateway.prompt_cache.cache_keys`). Two
conversations that open alike share a tier (they may only rise together). Entries live
``ttl_s`` after their last turn (past the providers' prompt-cache lifetimes, a switch costs
nothing more) in one LRU of ``max_entries``; a forgotten conversation is scored afresh.
Each entry also holds a digest of the text its weak tier was last scored on: a tool-call
loop's turns repeat their user message, so they are kept without scoring again (the
router's embedding is the costliest part of a decision).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from gateway.formats.chat_text import leading_messages, opening_message

__all__ = ["ConversationTiers", "conversation_id", "scored_digest"]


def scored_digest(text: str, depth: int) -> bytes:
    """16 bytes naming what a decision scores: the last user message's text and the
    conversation's depth (user turns)."""
    return hashlib.blake2b(f"{depth}\0{text}".encode(), digest_size=16).digest()


def conversation_id(key_id: str | None, router: str, chat: dict[str, Any]
                    ) -> tuple[bytes | None, bool]:
    """(16 bytes naming the conversation of a request in chat form (``ctx.chat``), whether
    the request continues it: an assistant turn after the opening message). (None, False)
    when there is no opening message."""
    messages = chat.get("messages")
    if not isinstance(messages, list):
        return None, False
    leading, opening = leading_messages(messages), opening_message(messages)
    if opening is None:
        return None, False
    continues = any(isinstance(m, dict) and m.get("role") == "assistant"
                    for m in messages[len(leading) + 1:])
    try:
        shared = orjson.dumps([chat.get("tools"), leading, opening],
                              option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:  # not JSON (a client body always is): no conversation to keep
        return None, False
    digest = hashlib.blake2b(shared, digest_size=16, person=b"gw-route-conv")
    digest.update(b"\0" + (key_id or "").encode() + b"\0" + router.encode())
    return digest.digest(), continues


class ConversationTiers:
    """Tier by conversation id, in LRU order, forgotten ``ttl_s`` seconds after last use or
    when ``max_entries`` is passed. ``clock``: seconds, monotonic."""

    def __init__(self, ttl_s: float = 3600.0, max_entries: int = 65_536,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._tiers: OrderedDict[bytes, tuple[str, bytes | None, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tiers)

    def get(self, conversation: bytes) -> tuple[str | None, bytes | None]:
        """(The conversation's tier, the digest of what it was last scored on), or (None,
        None) when it is unknown or expired."""
        held = self._tiers.get(conversation)
        if held is None:
            return None, None
        tier, scored, at = held
        if self.clock() - at > self.ttl_s:
            del self._tiers[conversation]
            return None, None
        self._tiers.move_to_end(conversation)
        return tier, scored

    def put(self, conversation: bytes, tier: str, scored: bytes | None = None) -> None:
        """Keep ``tier`` for the conversation (refreshing its age), with ``scored``: the
        digest of the text it was scored on (:func:`scored_digest`), evicting the least
        recently used entry past ``max_entries``."""
        self._tiers[conversation] = (tier, scored, self.clock())
        self._tiers.move_to_end(conversation)
        while len(self._tiers) > self.max_entries:
            self._tiers.popitem(last=False)
