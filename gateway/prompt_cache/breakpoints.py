"""Anthropic cache breakpoints: where the gateway adds ``cache_control`` markers, and with
which TTL.

Source: https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching. A marker asks
Anthropic to cache the prefix up to and including its block (tools, then system, then
messages); a later request reads it when its own marker's prefix starts with it, looking
back at most ~20 blocks from each marker. At most 4 markers a request; a prefix shorter than
the model's minimum (1024 tokens for most models, 2048 or 4096 for some) is not cached;
``thinking`` and ``redacted_thinking`` blocks take no marker; a 1-hour entry must come
before any 5-minute one.

:func:`place` keeps every marker the client set (they count against the 4; so does a
top-level ``cache_control``, Anthropic's automatic caching) and adds, while markers are
left, in this order of value:

1. **rolling**: on the last block of the last user turn, so the next request of the
   conversation reads everything before its new turns;
2. **intermediate**: on the last block this key had cached, when the rolling marker is more
   than ``lookback`` blocks past it (a long agent step: many tool results at once), so that
   it is read instead of missed;
3. **system**: the end of the system prompt, shared by every conversation that uses it;
4. **tools**: the end of the tool definitions.

Each only where the prefix reaches ``min_tokens`` (estimated as UTF-8 bytes / 4: cheap, and
at or above Claude's own count for English text and JSON, so a marker is rarely put on a
prefix too short for it). TTL: ``5m`` (Anthropic's default, no ``ttl`` written), ``1h``, or
``auto``: ``1h`` for a prefix this key last sent between 5 and 60 minutes ago (a 5-minute
entry would have expired; a 1-hour one would not), else ``5m``; markers before a 1-hour one
are made 1-hour too, and none after a client's 5-minute marker is.

Pure: the caller gives ``seen`` (a prefix fingerprint -> when last cached, or None) and
``now``, and remembers :attr:`Placed.prefixes` once the request went through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import orjson

__all__ = ["BYTES_PER_TOKEN", "MAX_MARKERS", "Placed", "min_tokens_for", "place"]

MAX_MARKERS = 4
BYTES_PER_TOKEN = 4
#: ``auto`` TTL: a prefix seen again after more than 5 and at most 60 minutes gets 1h (s).
_AUTO_1H = (300.0, 3600.0)
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})

Ttl = Literal["5m", "1h", "auto"]
Where = tuple[str, int, int]  # ("tools" | "system" | "messages", index, block index or -1)


@dataclass(frozen=True, slots=True)
class Placed:
    """What :func:`place` did: ``added`` markers, and ``prefixes``: the fingerprints of every
    marked prefix in the body (the client's and the gateway's), to remember once sent."""

    added: int
    prefixes: tuple[int, ...]


@dataclass(slots=True)
class _Block:
    where: Where
    kind: str
    tokens: float  # estimated tokens of the prefix through this block
    chain: int  # fingerprint of that prefix
    ttl: str | None  # the client's marker's TTL, None when unmarked
    markers: int  # the client's markers on it and inside it


def min_tokens_for(model: str, table: dict[str, int], default: int) -> int:
    """The minimum cacheable prompt of ``model``: the entry of ``table`` whose key is the
    longest prefix of the model name, else ``default``."""
    best, length = default, -1
    for prefix, tokens in table.items():
        if len(prefix) > length and model.startswith(prefix):
            best, length = tokens, len(prefix)
    return best


def place(body: dict[str, Any], *, min_tokens: int, ttl: Ttl, lookback: int,
          seen: Callable[[int], float | None], now: float) -> tuple[dict[str, Any], Placed]:
    """``body`` (a Messages request) with the gateway's markers added (rules in the module
    docstring). Copies what it changes; ``body`` itself is left as it was."""
    blocks = _walk(body)
    client = [b for b in blocks if b.ttl is not None]
    budget = MAX_MARKERS - sum(b.markers for b in client) \
        - (body.get("cache_control") is not None)
    if budget <= 0 or not blocks:
        return body, Placed(0, tuple(b.chain for b in client))
    chosen: dict[int, bool] = {}  # block index -> wants a 1-hour TTL

    def choose(i: int | None, interval: float | None) -> None:
        if i is None or len(chosen) >= budget or i in chosen:
            return
        block = blocks[i]
        if block.ttl is None and block.kind not in _UNMARKABLE and block.tokens >= min_tokens:
            chosen[i] = interval is not None and _AUTO_1H[0] < interval <= _AUTO_1H[1]

    rolling = _rolling(body, blocks)
    cached = _last_cached(blocks, rolling, seen)
    when = None if cached is None else seen(blocks[cached].chain)
    since = None if when is None else now - when
    choose(rolling, since)
    if rolling is not None and cached is not None and rolling - cached > lookback:
        # Read what was cached: a marker on it, or on a block within lookback after it.
        choose(_markable_from(blocks, cached, min(rolling, cached + lookback + 1)), since)
    for section in ("system", "tools"):
        last = max((i for i, b in enumerate(blocks) if b.where[0] == section), default=None)
        if last is not None:
            when = seen(blocks[last].chain)
            choose(last, None if when is None else now - when)
    if not chosen:
        return body, Placed(0, tuple(b.chain for b in client))
    ttls = _ttls(blocks, chosen, ttl)
    out = _mark(body, {blocks[i].where: ttls[i] for i in chosen})
    marked = sorted([*chosen, *(i for i, b in enumerate(blocks) if b.ttl is not None)])
    return out, Placed(len(chosen), tuple(blocks[i].chain for i in marked))


# -- reading the body --------------------------------------------------------------------------

def _walk(body: dict[str, Any]) -> list[_Block]:
    """Every top-level block in Anthropic's order (tools, system, messages) with the size
    and fingerprint of the prefix through it. A string is one text block; unmarked tools
    are measured as one block (only the end of the tools may take a marker then)."""
    blocks: list[_Block] = []
    tokens = 0.0
    chain = 0
    for where, role, block in _pieces(body):
        kind, size, fingerprint = _measure(block)
        tokens += size / BYTES_PER_TOKEN
        chain = hash((chain, role, fingerprint))
        found = _markers(block) if isinstance(block, dict) else ()
        ttl = None if not found else \
            str((found[-1].get("ttl") if isinstance(found[-1], dict) else None) or "5m")
        blocks.append(_Block(where, kind, tokens, chain, ttl, len(found)))
    return blocks


def _pieces(body: dict[str, Any]) -> Iterator[tuple[Where, str, Any]]:
    """(where, role, block) in prompt order."""
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        if any(isinstance(t, dict) and "cache_control" in t for t in tools):
            yield from ((("tools", i, -1), "tools", t) for i, t in enumerate(tools))
        else:
            yield ("tools", len(tools) - 1, -1), "tools", tools
    system = body.get("system")
    if isinstance(system, str):
        yield ("system", -1, -1), "system", system
    elif isinstance(system, list):
        yield from ((("system", -1, j), "system", b) for j, b in enumerate(system))
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, dict):
            continue
        role, content = str(message.get("role")), message.get("content")
        if isinstance(content, list):
            yield from ((("messages", i, j), role, b) for j, b in enumerate(content))
        elif content is not None:
            yield ("messages", i, -1), role, content


def _measure(block: Any) -> tuple[str, int, int]:
    """(type, size in bytes, fingerprint) of a block, its marker left out: a plain text block
    and the same string measure the same."""
    if isinstance(block, str):
        return "text", _size(block), hash(("text", block))
    if not isinstance(block, dict):
        raw = orjson.dumps(block, option=orjson.OPT_SORT_KEYS)
        return "", len(raw), hash(raw)
    kind = str(block.get("type", ""))
    text = block.get("text")
    if kind == "text" and isinstance(text, str) and all(
            k in ("type", "text", "cache_control") for k in block):
        return kind, _size(text), hash(("text", text))
    if "cache_control" in block:
        block = {k: v for k, v in block.items() if k != "cache_control"}
    raw = orjson.dumps(block, option=orjson.OPT_SORT_KEYS)
    return kind, len(raw), hash(raw)


def _size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _markers(block: dict[str, Any]) -> list[Any]:
    """A block's client markers: its own, and those inside its content (a tool result's
    blocks), which end the same prefix and count against the 4 too."""
    inner = block.get("content")
    found = [b["cache_control"] for b in inner if isinstance(b, dict)
             and b.get("cache_control") is not None] if isinstance(inner, list) else []
    if block.get("cache_control") is not None:
        found.append(block["cache_control"])
    return found


def _rolling(body: dict[str, Any], blocks: list[_Block]) -> int | None:
    """The last block of the last user message."""
    messages = body.get("messages") or []
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "user":
            mine = [k for k, b in enumerate(blocks) if b.where[0] == "messages"
                    and b.where[1] == i]
            return mine[-1] if mine else None
    return None


def _last_cached(blocks: list[_Block], rolling: int | None,
                 seen: Callable[[int], float | None]) -> int | None:
    """The last conversation block, at or before ``rolling``, whose prefix was cached."""
    if rolling is None:
        return None
    for i in range(rolling, -1, -1):
        if blocks[i].where[0] != "messages":
            return None
        if seen(blocks[i].chain) is not None:
            return i
    return None


def _markable_from(blocks: list[_Block], start: int, stop: int) -> int | None:
    for i in range(start, stop):
        if blocks[i].kind not in _UNMARKABLE:
            return i
    return None


# -- writing the markers -------------------------------------------------------------------

def _ttls(blocks: list[_Block], chosen: dict[int, bool], policy: Ttl) -> dict[int, str]:
    """Each chosen block's TTL, in order: a 1-hour marker is never after a 5-minute one."""
    want = {i: policy == "1h" or (policy == "auto" and hour) for i, hour in chosen.items()}
    order = sorted([*chosen, *(i for i, b in enumerate(blocks) if b.ttl is not None)])
    later_hour = False
    for i in reversed(order):  # before a 1-hour marker: 1 hour
        if i in chosen:
            want[i] = want[i] or later_hour
            later_hour = later_hour or want[i]
        elif blocks[i].ttl == "1h":
            later_hour = True
    client_5m = False
    for i in order:  # after a client's 5-minute marker: 5 minutes
        if i in chosen:
            want[i] = want[i] and not client_5m
        elif blocks[i].ttl != "1h":
            client_5m = True
    return {i: "1h" if hour else "5m" for i, hour in want.items()}


def _marker(ttl: str) -> dict[str, str]:
    return {"type": "ephemeral", "ttl": "1h"} if ttl == "1h" else {"type": "ephemeral"}


def _mark(body: dict[str, Any], marks: dict[Where, str]) -> dict[str, Any]:
    """``body`` with a marker on each block of ``marks``, copying only the path to each."""
    out = dict(body)
    for (section, i, j), ttl in marks.items():
        marker = _marker(ttl)
        if section == "tools":
            tools = out["tools"] = list(out["tools"])
            tools[i] = {**tools[i], "cache_control": marker}
        elif section == "system":
            system = out["system"]
            if isinstance(system, str):
                out["system"] = [{"type": "text", "text": system, "cache_control": marker}]
            else:
                system = out["system"] = list(system)
                system[j] = {**system[j], "cache_control": marker}
        else:
            messages = out["messages"] = list(out["messages"])
            message = messages[i] = dict(messages[i])
            content = message["content"]
            if isinstance(content, str):
                message["content"] = [{"type": "text", "text": content,
                                       "cache_control": marker}]
            else:
                content = message["content"] = list(content)
                content[j] = {**content[j], "cache_control": marker}
    return out
