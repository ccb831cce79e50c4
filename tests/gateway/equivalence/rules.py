"""What the two APIs' rules share: what a request may see changed (:class:`Allowed`), what
the checker found (:class:`Verdict`), P1 (tools), and the compress stage's texts of the
current turn (:class:`Text`, :func:`compressed`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.gateway.equivalence.compressed import check_compressed
from tests.gateway.equivalence.diff import first_difference, shorten

__all__ = ["Allowed", "Text", "Verdict", "canonical", "compressed", "current_turn", "tools"]


@dataclass(frozen=True)
class Allowed:
    """What this request may see changed: ``models``, the upstream model names its
    ``model`` may become; ``compress``, whether the compress stage is on; ``changing``,
    system prompt lines the traffic showed to change (P4 (b)); ``bedrock``, whether the
    model's upstream is Bedrock's InvokeModel (B1)."""

    models: frozenset[str]
    compress: bool = False
    changing: frozenset[str] = frozenset()
    bedrock: bool = False


@dataclass
class Verdict:
    """``error``: the first breach of the contract, None when it holds; what the gateway
    did within it: lines ``moved``, Anthropic ``markers`` added, texts ``compressed``."""

    error: str | None = None
    moved: list[str] = field(default_factory=list)
    markers: int = 0
    compressed: int = 0


def tools(c: dict[str, Any], u: dict[str, Any]) -> str | None:
    """P1: the same multiset of tool definitions; the client's order put back."""
    mine, theirs = c.get("tools"), u.get("tools")
    if not isinstance(mine, list) or not isinstance(theirs, list):
        return None
    pool = [canonical(t) for t in theirs]
    for i, tool in enumerate(mine):
        key = canonical(tool)
        if key in pool:
            pool.remove(key)
            continue
        name = tool_name(tool)
        twin = next((t for t in theirs if name and tool_name(t) == name), None)
        how = first_difference(tool, twin, f"$.tools[{i}]") if twin is not None else \
            "no tool of that name upstream"
        return f"$.tools: the client's tools[{i}] ({name!r}) is not sent as it was: {how}"
    if pool:
        return f"$.tools: upstream has a tool the client did not send: {shorten(pool[0])}"
    u["tools"] = mine
    return None


def canonical(value: Any) -> bytes:
    """Equal for equal JSON values, key order aside; ``true``, ``1`` and ``1.0`` differ."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(value, sort_keys=True).encode()


def tool_name(tool: Any) -> str:
    if not isinstance(tool, dict):
        return ""
    holder = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return str(holder.get("name", ""))


def current_turn(messages: list[Any]) -> int:
    """Index of the current turn's first message: after the last assistant message."""
    start = 0
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            start = i + 1
    return start


@dataclass
class Text:
    """One text of the current turn: ``mine[key]`` at the client, ``theirs[key]`` upstream;
    ``request``: the newest user message's last text; ``marked``: the client put a
    ``cache_control`` marker on it."""

    path: str
    key: str
    mine: dict[str, Any]
    theirs: dict[str, Any]
    request: bool = False
    marked: bool = False


def compressed(texts: list[Text], allowed: Allowed, verdict: Verdict) -> str | None:
    """Each upstream text of the current turn that differs must be a compression of the
    client's (and is then put back)."""
    frozen = max((n for n, t in enumerate(texts) if t.marked), default=-1)
    for n, text in enumerate(texts):
        a, b = text.mine[text.key], text.theirs.get(text.key)
        if not isinstance(b, str) or a == b:
            continue
        if not allowed.compress:
            return None  # the final comparison names the difference
        where = f"{text.path}.{text.key}"
        if n <= frozen:
            return f"{where}: compressed, but the client marked it (or a later text) for caching"
        why = check_compressed(a, b, text.request)
        if why is not None:
            return f"{where}: not a compression of the client's text: {why}"
        verdict.compressed += 1
        text.theirs[text.key] = a
    return None
