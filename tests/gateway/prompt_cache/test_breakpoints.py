"""Anthropic breakpoints: where markers go, how many, with which TTL; checked against the fake
Anthropic API's own validation (at most 4 markers, none on thinking blocks)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.prompt_cache.breakpoints import _walk, min_tokens_for, place
from gateway.testing.fake_anthropic import validate_request

LONG = "word " * 80  # 400 bytes: 100 estimated tokens
EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def tool(name: str) -> dict[str, Any]:
    return {"name": name, "description": LONG,
            "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}


def body(turns: int = 1, *, system: Any = LONG, tools: int = 2, **extra: Any) -> dict[str, Any]:
    """A Messages body: ``turns`` user turns (an agent loop: tool_use and tool_result
    between them)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start " + LONG}]
    for i in range(1, turns):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{i}", "name": "t0", "input": {"x": str(i)}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"r{i} " + LONG}]})
    out: dict[str, Any] = {"model": "claude-x", "max_tokens": 16,
                           "tools": [tool(f"t{i}") for i in range(tools)],
                           "messages": messages, **extra}
    if system is not None:
        out["system"] = system
    return out


def run(b: dict[str, Any], *, min_tokens: int = 50, ttl: Any = "5m", lookback: int = 18,
        seen: Any = None, now: float = 0.0) -> tuple[dict[str, Any], int]:
    out, placed = place(b, min_tokens=min_tokens, ttl=ttl, lookback=lookback,
                        seen=seen or (lambda prefix: None), now=now)
    validate_request(out)  # what the real API would accept
    return out, placed.added


def markers(b: dict[str, Any]) -> dict[str, Any]:
    """Where the markers are: ``tools.1``, ``system``, ``system.0``, ``messages.2.0``..."""
    found: dict[str, Any] = {}
    for i, t in enumerate(b.get("tools") or ()):
        if "cache_control" in t:
            found[f"tools.{i}"] = t["cache_control"]
    system = b.get("system")
    for j, block in enumerate(system if isinstance(system, list) else ()):
        if "cache_control" in block:
            found[f"system.{j}"] = block["cache_control"]
    for i, m in enumerate(b["messages"]):
        for j, block in enumerate(m["content"] if isinstance(m["content"], list) else ()):
            if "cache_control" in block:
                found[f"messages.{i}.{j}"] = block["cache_control"]
    return found


def test_tools_system_and_the_conversation_tail_are_marked():
    b = body(turns=2)
    out, added = run(b)
    assert added == 3
    assert markers(out) == {"tools.1": EPHEMERAL, "system.0": EPHEMERAL,
                            "messages.2.0": EPHEMERAL}
    assert out["system"] == [{"type": "text", "text": LONG, "cache_control": EPHEMERAL}]


def test_the_input_body_is_not_changed():
    b = body(turns=3)
    before = copy.deepcopy(b)
    run(b)
    assert b == before


@pytest.mark.parametrize(("client", "expected"), [
    # the client's markers stay where they are and count against the 4
    ({"messages.0": EPHEMERAL}, {"messages.0.0", "messages.2.0", "system.0", "tools.1"}),
    ({"top": EPHEMERAL, "tools.0": EPHEMERAL}, {"tools.0", "messages.2.0", "system.0"}),
    # a marker inside the last tool result marks the tail already: the last slot goes to
    # the end of the tools
    ({"nested": EPHEMERAL, "system": EPHEMERAL, "tools.0": EPHEMERAL},
     {"tools.0", "system.0", "tools.1"}),
    ({"tools.0": EPHEMERAL, "tools.1": EPHEMERAL, "system": EPHEMERAL, "messages.0": EPHEMERAL},
     {"tools.0", "tools.1", "system.0", "messages.0.0"}),
])
def test_at_most_four_markers_with_the_clients_kept(client, expected):
    b = body(turns=2, system=[{"type": "text", "text": LONG}])
    b["messages"][0]["content"] = [{"type": "text", "text": LONG}]
    for where, marker in client.items():
        if where == "top":
            b["cache_control"] = marker
        elif where == "nested":
            b["messages"][2]["content"][0]["content"] = [
                {"type": "text", "text": "r", "cache_control": marker}]
        elif where == "system":
            b["system"][0]["cache_control"] = marker
        elif where.startswith("tools"):
            b["tools"][int(where[-1])]["cache_control"] = marker
        else:
            b["messages"][0]["content"][0]["cache_control"] = marker
    out, added = run(b)
    assert set(markers(out)) == expected
    client_count = len(client)
    assert added == len(expected) - client_count + ("top" in client) + ("nested" in client)
    assert added + client_count <= 4


def test_nothing_is_marked_below_the_minimum_length():
    b = body(turns=1, system="Be brief.", tools=0)
    b["messages"][0]["content"] = "hi"
    assert run(b)[1] == 0
    # Tools alone are too short, tools and system are long enough: no marker on the tools.
    b = body(turns=1, tools=1)
    out, _ = run(b, min_tokens=150)
    assert set(markers(out)) == {"system.0", "messages.0.0"}


def test_min_tokens_by_model_family():
    table = {"claude-3-haiku": 2048, "claude-haiku-4-5": 4096, "claude-haiku": 3000}
    assert min_tokens_for("claude-haiku-4-5-20251001", table, 1024) == 4096
    assert min_tokens_for("claude-haiku-9", table, 1024) == 3000
    assert min_tokens_for("claude-sonnet-4-5", table, 1024) == 1024


def test_the_rolling_marker_is_on_the_last_user_turn_not_an_assistant_prefill():
    b = body(turns=1, tools=0, system=None)
    b["messages"].append({"role": "assistant", "content": "The answer is"})
    out, added = run(b)
    assert added == 1 and set(markers(out)) == {"messages.0.0"}
    assert out["messages"][0]["content"] == [{"type": "text", "text": "start " + LONG,
                                              "cache_control": EPHEMERAL}]


def remembered(b: dict[str, Any]) -> Any:
    """``seen`` for a next request: the prefixes ``b`` had marked, cached at time 0."""
    _, placed = place(b, min_tokens=50, ttl="5m", lookback=18, seen=lambda p: None, now=0)
    return lambda prefix: 0.0 if prefix in placed.prefixes else None


def test_an_intermediate_marker_reads_what_was_cached_past_the_lookback():
    first = body(turns=3)  # its tail: messages.4.0
    seen = remembered(first)
    near = body(turns=11)  # the tail 16 blocks further: within the lookback
    out, added = run(near, seen=seen)
    assert set(markers(out)) == {"tools.1", "system.0", "messages.20.0"} and added == 3
    far = body(turns=13)  # 20 blocks further: a marker where the last request's tail was
    out, added = run(far, seen=seen)
    assert set(markers(out)) == {"tools.1", "system.0", "messages.4.0", "messages.24.0"}
    assert added == 4


def test_thinking_blocks_never_get_a_marker():
    b = body(turns=3)
    for i in (1, 3):
        b["messages"][i]["content"].insert(0, {"type": "thinking", "thinking": "hmm",
                                               "signature": "sig"})
    # Pretend the last cached block was a thinking block: the marker goes to the next
    # block that may carry one, within the lookback.
    thinking = next(blk.chain for blk in _walk(b) if blk.kind == "thinking")
    out, _ = run(b, lookback=1, seen=lambda p: 0.0 if p == thinking else None)
    assert "messages.1.1" in markers(out)
    assert all("cache_control" not in blk for m in out["messages"]
               if isinstance(m["content"], list) for blk in m["content"]
               if blk["type"] == "thinking")


@pytest.mark.parametrize(("ttl", "minutes_ago", "expected"), [
    ("5m", 10, EPHEMERAL),
    ("1h", None, HOUR),
    ("auto", None, EPHEMERAL),  # never seen
    ("auto", 2, EPHEMERAL),  # seen again within 5 minutes: the 5-minute entry still lives
    ("auto", 10, HOUR),  # seen again after 10 minutes: worth an hour
    ("auto", 59, HOUR),
    ("auto", 90, EPHEMERAL),  # an hour would not have kept it either
])
def test_ttl_by_policy_and_by_how_long_ago_the_prefix_was_seen(ttl, minutes_ago, expected):
    first = body(turns=2)
    seen = remembered(first) if minutes_ago is not None else None
    out, _ = run(body(turns=3), ttl=ttl, seen=seen, now=60.0 * (minutes_ago or 0))
    assert set(map(str, markers(out).values())) == {str(expected)}


def test_a_one_hour_marker_never_follows_a_five_minute_one():
    # The client's 5-minute marker on the system prompt: the gateway's later ones stay 5m.
    b = body(turns=2, system=[{"type": "text", "text": LONG, "cache_control": EPHEMERAL}])
    out, _ = run(b, ttl="1h")
    assert markers(out) == {"tools.1": HOUR, "system.0": EPHEMERAL, "messages.2.0": EPHEMERAL}
    # The client's 1-hour marker on the last turn: the gateway's earlier ones are 1h too.
    b = body(turns=2)
    b["messages"][2]["content"][0]["cache_control"] = HOUR
    out, _ = run(b, ttl="5m")
    assert markers(out) == {"tools.1": HOUR, "system.0": HOUR, "messages.2.0": HOUR}
