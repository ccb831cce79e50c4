"""Cache points in a Bedrock Converse request (the prompt_cache stage's breakpoints, in
Converse's shape): a ``cachePoint`` block after the system prompt and one after the
conversation's last message (the rolling tail, as for Anthropic), at most 4 with the
client's own, for the models whose prompt cache Bedrock serves (Claude and Nova; others
would refuse the block). Pure.
Source: https://docs.aws.amazon.com/bedrock/latest/userguide/prompt-caching.html
"""

from __future__ import annotations

from typing import Any

from gateway.formats.converse import CACHE_POINT

__all__ = ["MAX_POINTS", "cache_points", "caches"]

#: Bedrock's limit of cache checkpoints per request (Claude's, as Anthropic's).
MAX_POINTS = 4
_CACHING = ("anthropic.claude", "amazon.nova")


def caches(model: str) -> bool:
    """Whether Bedrock serves a prompt cache for ``model`` (an id, an inference profile id
    such as ``us.anthropic.claude-...``, or an ARN naming one)."""
    return any(family in model for family in _CACHING)


def _points(blocks: Any) -> int:
    return sum(1 for b in blocks if isinstance(b, dict) and "cachePoint" in b) \
        if isinstance(blocks, list) else 0


def _ends_with_point(blocks: list[Any]) -> bool:
    return bool(blocks) and isinstance(blocks[-1], dict) and "cachePoint" in blocks[-1]


def cache_points(body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``body`` with cache points added (a copy where changed), and how many were added."""
    model = str(body.get("model", ""))
    messages = body.get("messages")
    if not caches(model) or not isinstance(messages, list) or not messages:
        return body, 0
    tools = (body.get("toolConfig") or {}).get("tools")
    used = _points(body.get("system")) + _points(tools) + sum(
        _points(m.get("content")) for m in messages if isinstance(m, dict))
    out, added = dict(body), 0
    system = body.get("system")
    if isinstance(system, list) and system and not _ends_with_point(system) \
            and used + added < MAX_POINTS:
        out["system"] = [*system, dict(CACHE_POINT)]
        added += 1
    last = messages[-1]
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, list) and content and not _ends_with_point(content) \
            and used + added < MAX_POINTS:
        out["messages"] = [*messages[:-1], {**last, "content": [*content, dict(CACHE_POINT)]}]
        added += 1
    return (out, added) if added else (body, 0)
