"""The contract's rules for Anthropic Messages bodies: P3 (``cache_control`` markers: both
sides normalised, a string being one text block, and the markers the client did not set
dropped and counted), P1 (tools), P4 (moved lines, a text block ending the last user
message) and the compress stage's texts (text blocks, tool results)."""

from __future__ import annotations

from typing import Any

from tests.gateway.equivalence.diff import shorten
from tests.gateway.equivalence.relocation import Moves, block
from tests.gateway.equivalence.rules import (
    Allowed,
    Text,
    Verdict,
    canonical,
    compressed,
    current_turn,
    tools,
)

__all__ = ["MARKERS", "MAX_MARKERS", "anthropic"]

MARKERS = ({"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"})
MAX_MARKERS = 4


def anthropic(c: dict[str, Any], u: dict[str, Any], allowed: Allowed, verdict: Verdict
              ) -> str | None:
    """As :func:`~tests.gateway.equivalence.openai_rules.openai`, for Messages bodies."""
    for body in (c, u):
        if isinstance(body.get("system"), str):
            body["system"] = [{"type": "text", "text": body["system"]}]
        for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                message["content"] = [{"type": "text", "text": message["content"]}]
    error = _markers(c, u, verdict) or tools(c, u)
    if error is not None:
        return error
    moves = Moves(allowed.changing)
    for text in _blocks("$.system", c.get("system"), u.get("system")):
        if text.key == "text":
            moves.compare(text.path, text.mine["text"], text.theirs["text"],
                          lambda t=text: t.theirs.__setitem__("text", t.mine["text"]))
    moves.finish()
    verdict.moved = moves.lines
    messages, others = c["messages"], u.get("messages")
    if not isinstance(others, list):
        return moves.error
    if moves.error is None and moves.lines:
        last = messages[-1] if messages else None
        wanted = [{"type": "text", "text": block(moves.lines)}]
        if not (isinstance(last, dict) and last.get("role") == "user"):
            moves.nothing_may_move("the last message is not the user's")
        elif len(others) == len(messages) and isinstance(others[-1].get("content"), list) \
                and others[-1]["content"][-1:] == wanted:
            others[-1]["content"].pop()
        else:
            tail = others[-1].get("content") if others and isinstance(others[-1], dict) else None
            moves.error = ("moved lines: the last user message should end with a text block "
                           f"{shorten(wanted[0]['text'])}, it ends with "
                           f"{shorten(tail[-1] if isinstance(tail, list) and tail else tail)}")
    if moves.error is not None:
        return moves.error
    texts: list[Text] = []
    for i in range(current_turn(messages), min(len(messages), len(others))):
        message, other = messages[i], others[i]
        if isinstance(message, dict) and message.get("role") == "user" \
                and isinstance(other, dict):
            found = _blocks(f"$.messages[{i}].content", message.get("content"),
                            other.get("content"))
            own = [t for t in found if t.key == "text" and t.path.count("content") == 1]
            if own:
                for text in texts:
                    text.request = False
                own[-1].request = True
            texts += found
    return compressed(texts, allowed, verdict)


def _blocks(path: str, mine: Any, theirs: Any) -> list[Text]:
    """The texts of two lists of content blocks, pair by pair: text blocks' ``text``, tool
    results' ``content`` (a string, or text blocks); a marker on a tool result covers its
    content."""
    if not (isinstance(mine, list) and isinstance(theirs, list)):
        return []
    out = []
    for j, (p, q) in enumerate(zip(mine, theirs)):
        if not (isinstance(p, dict) and isinstance(q, dict)):
            continue
        where, marked = f"{path}[{j}]", "cache_control" in p
        if p.get("type") == "text" and isinstance(p.get("text"), str) \
                and isinstance(q.get("text"), str):
            out.append(Text(where, "text", p, q, marked=marked))
        elif p.get("type") == "tool_result" and isinstance(p.get("content"), str):
            out.append(Text(where, "content", p, q, marked=marked))
        elif p.get("type") == "tool_result":
            inner = _blocks(f"{where}.content", p.get("content"), q.get("content"))
            for text in inner:
                text.marked = text.marked or marked
            out += inner
    return out


def _markers(c: dict[str, Any], u: dict[str, Any], verdict: Verdict) -> str | None:
    """P3: drop (and count) the markers the gateway added; the client's stay as they were."""
    added: list[tuple[str, Any]] = []

    def strip(path: str, mine: Any, theirs: Any) -> None:
        if isinstance(theirs, dict) and "cache_control" in theirs and not (
                isinstance(mine, dict) and "cache_control" in mine):
            added.append((path, theirs.pop("cache_control")))

    def walk(path: str, mine: Any, theirs: Any) -> None:
        if not isinstance(theirs, list):
            return
        mine = mine if isinstance(mine, list) else []
        for j, q in enumerate(theirs):
            p = mine[j] if j < len(mine) else None
            strip(f"{path}[{j}]", p, q)
            if isinstance(q, dict):
                walk(f"{path}[{j}].content", p.get("content") if isinstance(p, dict) else None,
                     q.get("content"))

    walk("$.system", c.get("system"), u.get("system"))
    mine = c.get("messages") if isinstance(c.get("messages"), list) else []
    for i, message in enumerate(u.get("messages") or ()):
        other = mine[i] if i < len(mine) else None
        if isinstance(message, dict):
            walk(f"$.messages[{i}].content",
                 other.get("content") if isinstance(other, dict) else None,
                 message.get("content"))
    tools = c.get("tools") if isinstance(c.get("tools"), list) else []
    for j, tool in enumerate(u.get("tools") if isinstance(u.get("tools"), list) else ()):
        if isinstance(tool, dict) and "cache_control" in tool:
            bare = canonical({k: v for k, v in tool.items() if k != "cache_control"})
            if any(canonical(t) == bare for t in tools):  # the client's has none there
                added.append((f"$.tools[{j}]", tool.pop("cache_control")))
    for path, marker in added:
        if marker not in MARKERS:
            return f"{path}.cache_control: {shorten(marker)} is not an allowed marker"
    theirs = _count_markers(c)
    if added and theirs + len(added) > MAX_MARKERS:
        return (f"{len(added)} cache_control markers added to the client's {theirs}: more "
                f"than {MAX_MARKERS} in all ({', '.join(p for p, _ in added)})")
    verdict.markers = len(added)
    return None


def _count_markers(value: Any) -> int:
    """``cache_control`` keys anywhere in ``value`` (counted in its JSON: a walk in Python
    costs a millisecond on a τ-bench body)."""
    return canonical(value).count(b'"cache_control":')
