"""Prompt-cache affinity for a model's equivalent hosted deployments (keys, regions,
deployments of one model): a conversation stays on the deployment that holds its prompt
cache while that cache is warm, unless that deployment fails.

Providers cache prompt prefixes per deployment (OpenAI's automatic prompt caching, for 5-10
minutes idle; Anthropic's ``cache_control``, 5 minutes or 1 hour), so a gateway that spreads a
conversation's turns over several deployments pays full price and full prefill on each.
OpenRouter keeps a conversation on one provider for that reason. A conversation is named by
its ``prompt_cache_key`` (OpenAI's own parameter for routing to the same cache) when the
client sends one (as the request carries it by then: namespaced by the client's gateway key
at the door, :mod:`gateway.prompt_cache.cache_keys`, so one key's value names one
conversation and another key's same value another), else by a hash of what opens it: the
tools, the system prompt and the first message. A new conversation goes to the model's targets in turn; each attempt sent records
its target for the conversation, so after a failover the conversation follows the target
that answered. ``[balance] models = { NAME = "affinity" }``, ``affinity_ttl_s``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from gateway.config import Target

__all__ = ["Affinity", "conversation_key"]

MAX_CONVERSATIONS = 100_000
B = TypeVar("B")


def conversation_key(model: str, body: dict[str, Any]) -> int | None:
    """``body``'s conversation: its ``prompt_cache_key``, else the hash of its tools, system
    prompt and first message (None when it has no messages)."""
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return hash((model, key))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    opening = messages[:2] if messages[0].get("role") in ("system", "developer") else messages[:1]
    return hash((model, orjson.dumps((body.get("tools"), body.get("system"), opening))))


class Affinity:
    """Conversation -> the target that last took it, for ``ttl_s`` after its last request;
    the most recent ``MAX_CONVERSATIONS`` kept."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._held: OrderedDict[int, tuple[Target, float]] = OrderedDict()
        self._turn = 0

    def route(self, model: str, targets: Sequence[Target], body: dict[str, Any],
              ttl_s: float, build: Callable[[Target], B]
              ) -> tuple[Sequence[Target], Callable[[Target], B]]:
        """``targets`` with the conversation's own first (a new one: the next in turn), and
        ``build`` wrapped to record each target it is asked for."""
        key = conversation_key(model, body)
        if key is None or len(targets) < 2:
            return targets, build
        now, held = self.clock(), self._held
        entry = held.get(key)
        if entry is not None and entry[1] > now and entry[0] in targets:
            first = entry[0]
        else:
            first = targets[self._turn % len(targets)]
            self._turn += 1
        ordered = [first, *(t for t in targets if t != first)]

        def recording(target: Target) -> B:
            held[key] = (target, self.clock() + ttl_s)
            held.move_to_end(key)
            if len(held) > MAX_CONVERSATIONS:
                held.popitem(last=False)
            return build(target)

        return ordered, recording
