"""What a replica's prefix cache holds, as the gateway sees it: chained block keys of a
request's prompt, and a per-replica index of the keys it holds.

A prompt is cut into fixed-size blocks and each block's key hashes its content and the key
of the block before it, so equal keys mean equal prefixes and the blocks two prompts share
are their leading run of equal keys (vLLM's automatic prefix caching; this engine's
:mod:`local_engine.block_manager`). Two kinds of keys:

- **approximate** (:func:`byte_keys`): blocks of ``block_bytes`` bytes of a canonical
  rendering of a chat request (its tools, then each message's role, content and calls):
  what the gateway can compute without the model's tokenizer. The index of a replica then
  holds the keys this gateway *sent* it, evicted least recently used beyond the replica's
  KV capacity (SGLang's router keeps the same estimate as a radix tree of the text sent to
  each worker, ``cache_aware`` policy).
- **precise** (:func:`local_engine.block_manager.block_hashes` over the engine's own tokens):
  the very hashes the engine's block manager registers, so the index of a replica can be
  the set the engine reports holding (its KV events, as vLLM publishes them and llm-d's
  precise prefix-cache scorer consumes them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

__all__ = ["PrefixIndex", "byte_keys", "render"]


def render(body: dict[str, Any]) -> bytes:
    """A chat request's prompt as canonical bytes: its tools, then each message (role,
    content, tool calls, tool call id), in order; other fields (model, sampling, stream)
    change no prefix. Raises nothing on odd shapes: what is not a list counts as empty."""
    parts = []
    tools = body.get("tools")
    if tools:
        parts.append(orjson.dumps(tools))
    system = body.get("system")  # Anthropic Messages
    if system:
        parts.append(orjson.dumps(system))
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                parts.append(orjson.dumps((m.get("role"), m.get("content"),
                                           m.get("tool_calls"), m.get("tool_call_id"))))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt.encode())
    return b"\n".join(parts)


def byte_keys(data: bytes, block_bytes: int) -> list[int]:
    """Chained keys of ``data``'s whole blocks of ``block_bytes`` bytes (a partial last block
    has none: only whole blocks are shared, as an engine's full KV blocks)."""
    keys, h = [], 0
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        h = hash((h, data[start:start + block_bytes]))
        keys.append(h)
    return keys


class PrefixIndex:
    """The block keys a replica holds: ``match`` counts a prompt's leading keys held.
    ``capacity`` (blocks) bounds it, least recently used first out (None: unbounded, for
    a set the replica itself reports)."""

    __slots__ = ("_keys", "capacity")

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def match(self, keys: Sequence[int]) -> int:
        """How many of ``keys``, from the first, are held."""
        held = self._keys
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def add(self, keys: Iterable[int]) -> list[int]:
        """Hold ``keys`` (those already held become the most recently used); returns the
        keys evicted to stay within ``capacity``."""
        held = self._keys
        for key in keys:
            if key in held:
                held.move_to_end(key)
            else:
                held[key] = None
        evicted = []
        if self.capacity is not None:
            while len(held) > self.capacity:
                evicted.append(held.popitem(last=False)[0])
        return evicted

    def remove(self, keys: Iterable[int]) -> None:
        held = self._keys
        for key in keys:
            held.pop(key, None)

    def clear(self) -> None:
        self._keys.clear()
