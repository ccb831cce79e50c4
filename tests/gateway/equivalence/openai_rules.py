"""The contract's rules for OpenAI Chat Completions bodies: G2 (the stream's usage option), P2
and G3 (``prompt_cache_key``), P1 (tools), P4 (moved lines, appended to the last user message
or as a final user message after a tool result) and the compress stage's texts."""

from __future__ import annotations

import re
from typing import Any

from tests.gateway.equivalence.diff import first_difference, shorten
from tests.gateway.equivalence.relocation import Moves, block
from tests.gateway.equivalence.rules import Allowed, Text, Verdict, compressed, current_turn, tools

__all__ = ["CACHE_KEY", "CLIENT_CACHE_KEY", "openai"]

#: P2: the key the prompt_cache stage derives.
CACHE_KEY = re.compile(r"gw-[0-9a-f]{16}")
#: G3: the client's own, namespaced by its gateway key (gateway.prompt_cache.cache_keys).
CLIENT_CACHE_KEY = re.compile(r"gwk-[0-9a-f]{32}")


def openai(c: dict[str, Any], u: dict[str, Any], allowed: Allowed, verdict: Verdict
           ) -> str | None:
    """The first breach in the upstream body ``u`` of the client's ``c`` (the model already
    checked), undoing each allowed change in ``u`` as it is accounted for; None when what
    is left is for the final comparison."""
    if c.get("stream") is True:  # G2
        options = c.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")):
            wanted = {**(options if isinstance(options, dict) else {}), "include_usage": True}
            if first_difference(wanted, u.get("stream_options")) is not None:
                return (f"$.stream_options: expected {wanted} upstream (G2), got "
                        f"{shorten(u.get('stream_options'))}")
            _restore(c, u, "stream_options")
    error = _cache_key(c, u)
    if error is not None:
        return error
    error = tools(c, u)
    mine, theirs = c["messages"], u.get("messages")
    if error is not None or not isinstance(theirs, list):
        return error
    moves = Moves(allowed.changing)
    for i, message in enumerate(mine):
        if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
            break
        for text in _message_texts(f"$.messages[{i}]", message, theirs, i):
            moves.compare(text.path, text.mine[text.key], text.theirs[text.key],
                          lambda t=text: t.theirs.__setitem__(t.key, t.mine[t.key]))
    moves.finish()
    verdict.moved = moves.lines
    if moves.error is None and moves.lines:
        _openai_unappend(mine, theirs, block(moves.lines), moves)
    if moves.error is not None:
        return moves.error
    texts: list[Text] = []
    for i in range(current_turn(mine), len(mine)):
        if isinstance(mine[i], dict) and mine[i].get("role") in ("user", "tool"):
            found = _message_texts(f"$.messages[{i}]", mine[i], theirs, i)
            if found and mine[i]["role"] == "user":
                for text in texts:
                    text.request = False
                found[-1].request = True
            texts += found
    return compressed(texts, allowed, verdict)


def _cache_key(c: dict[str, Any], u: dict[str, Any]) -> str | None:
    """P2: a ``prompt_cache_key`` the client did not set is ``gw-`` + 16 hex digits; G3: one
    it set (a string) goes as ``gwk-`` + 32 hex digits (an HMAC of the value under its
    gateway key: the same value, the same key upstream)."""
    mine, theirs = c.get("prompt_cache_key"), u.get("prompt_cache_key")
    if mine is None and theirs is not None:  # P2 (a client's null, unshaped, goes as it came)
        if not CACHE_KEY.fullmatch(str(theirs)):
            return f"$.prompt_cache_key: {theirs!r} is not gw- + 16 hex digits"
        _restore(c, u, "prompt_cache_key")
    elif isinstance(mine, str):  # G3
        if not CLIENT_CACHE_KEY.fullmatch(str(theirs)):
            return (f"$.prompt_cache_key: the client's {mine!r} went as {theirs!r}, not "
                    "namespaced (gwk- + 32 hex digits)")
        _restore(c, u, "prompt_cache_key")
    return None


def _message_texts(path: str, message: dict[str, Any], theirs: list[Any], i: int
                   ) -> list[Text]:
    """The texts of a message (a content string, or text parts) whose upstream counterpart
    (``theirs[i]``) is a text too."""
    other = theirs[i] if i < len(theirs) else None
    if not isinstance(other, dict):
        return []
    a, b = message.get("content"), other.get("content")
    if isinstance(a, str) and isinstance(b, str):
        return [Text(path, "content", message, other, marked="cache_control" in message)]
    if not (isinstance(a, list) and isinstance(b, list)):
        return []
    return [Text(f"{path}.content[{j}]", "text", p, q, marked="cache_control" in p)
            for j, (p, q) in enumerate(zip(a, b))
            if isinstance(p, dict) and isinstance(q, dict) and isinstance(p.get("text"), str)
            and isinstance(q.get("text"), str)]


def _openai_unappend(mine: list[Any], theirs: list[Any], text: str, moves: Moves) -> None:
    """Take the moved lines' block off the end of the upstream's messages (P4)."""
    last = mine[-1] if mine else None
    role = last.get("role") if isinstance(last, dict) else None
    if role == "tool":
        if len(theirs) == len(mine) + 1 and theirs[-1] == {"role": "user", "content": text}:
            theirs.pop()
        else:
            moves.error = ("moved lines: the last message is a tool result, so a final user "
                           f"message should hold exactly {shorten(text)}; the last upstream "
                           f"is {shorten(theirs[-1] if theirs else None)}")
        return
    if role != "user":
        moves.nothing_may_move(f"the last message's role is {role!r}")
        return
    if len(theirs) != len(mine):
        moves.error = (f"moved lines: the last message is the user's, but the upstream got "
                       f"{len(theirs)} messages for the client's {len(mine)}, the last "
                       f"{shorten(theirs[-1] if theirs else None)}")
        return
    content = theirs[-1].get("content") if isinstance(theirs[-1], dict) else None
    if isinstance(last.get("content"), str) and isinstance(content, str) \
            and content.endswith("\n\n" + text):
        theirs[-1]["content"] = content[:-len(text) - 2]
    elif isinstance(last.get("content"), list) and isinstance(content, list) \
            and content[-1:] == [{"type": "text", "text": text}]:
        content.pop()
    else:
        tail = content[-1] if isinstance(content, list) and content else content
        tail = tail[-120:] if isinstance(tail, str) else tail
        moves.error = (f"moved lines: the last user message should end with {shorten(text)}, "
                       f"it ends with {shorten(tail)}")


def _restore(c: dict[str, Any], u: dict[str, Any], key: str) -> None:
    if key in c:
        u[key] = c[key]
    else:
        u.pop(key, None)
