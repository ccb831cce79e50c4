"""Canonical rendering: the same tools in any order and key order give the same bytes."""

from __future__ import annotations

import itertools

import orjson
import pytest

from gateway.prompt_cache.canonical import anthropic_order, sort_keys, tool_name, tools

SCHEMA = {"type": "object", "required": ["b", "a"],
          "properties": {"b": {"type": "string", "description": "B"},
                         "a": {"type": "integer", "minimum": 1.5}}}
OPENAI = [{"type": "function", "function": {"name": n, "description": f"{n} tool",
                                            "parameters": SCHEMA}} for n in ("c", "a", "b")]
ANTHROPIC = [{"name": n, "description": f"{n} tool", "input_schema": SCHEMA}
             for n in ("c", "a", "b")]


def reorder(value):
    """The same JSON with every object's keys reversed."""
    if isinstance(value, dict):
        return {k: reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reorder(v) for v in value]
    return value


@pytest.mark.parametrize("defs", [OPENAI, ANTHROPIC], ids=["openai", "anthropic"])
def test_any_order_of_tools_and_keys_renders_the_same_bytes(defs):
    renderings = {orjson.dumps(tools(reorder(list(order)) if flip else list(order)))
                  for order in itertools.permutations(defs) for flip in (False, True)}
    assert len(renderings) == 1
    [rendered] = renderings
    assert [tool_name(t) for t in orjson.loads(rendered)] == ["a", "b", "c"]


def test_keys_are_sorted_at_every_depth_and_lists_keep_their_order():
    out = sort_keys(SCHEMA)
    assert list(out) == ["properties", "required", "type"]
    assert list(out["properties"]) == ["a", "b"] and out["required"] == ["b", "a"]
    assert out["properties"]["a"]["minimum"] == 1.5


def test_tools_keep_the_clients_order_when_one_carries_a_cache_marker():
    marked = [*ANTHROPIC[:2], {**ANTHROPIC[2], "cache_control": {"type": "ephemeral"}}]
    assert [t["name"] for t in tools(marked)] == ["c", "a", "b"]
    assert [t["name"] for t in tools(ANTHROPIC, order=False)] == ["c", "a", "b"]


def test_anthropic_bodies_put_tools_system_and_messages_first():
    body = {"stream": True, "messages": [], "metadata": {}, "system": "s", "model": "m",
            "tools": [], "max_tokens": 1}
    assert list(anthropic_order(body)) == ["model", "max_tokens", "tools", "system",
                                           "messages", "stream", "metadata"]
