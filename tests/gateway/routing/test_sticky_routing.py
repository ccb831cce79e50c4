"""A routed conversation keeps its tier across turns (``sticky``, the default): it starts on
the tier its first turn scores, rises to the strong tier once a later turn scores strong, and
never drops back; a turn kept on the strong tier is not scored. The tiny artifact of
test_routing.py scores by the numbers in the last user message."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.routing.sticky import ConversationTiers, conversation_id
from tests.gateway.routing.test_routing import (
    EASY,
    HARD,
    MODELS,
    CountingEmbed,
    routing_policy,
    tiny_artifact,
)

SYSTEM = {"role": "system", "content": "You are a travel agent."}


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    return tiny_artifact(tmp_path / "tiny.npz")


def turn(gw: Any, messages: list[dict[str, Any]], key: str = "k") -> tuple[str, str]:
    """One turn: (the tier chosen, the answer's text)."""
    with openai.OpenAI(base_url=gw.v1, api_key=key, max_retries=0) as c:
        r = c.chat.completions.with_raw_response.create(model="auto", messages=messages)
        return r.http_response.headers["x-route-tier"], r.parse().choices[0].message.content


def converse(gw: Any, asks: list[str], key: str = "k") -> list[str]:
    """A conversation of ``asks`` as user turns: the tier of each turn."""
    messages: list[dict[str, Any]] = [SYSTEM]
    tiers = []
    for ask in asks:
        messages.append({"role": "user", "content": ask})
        tier, answer = turn(gw, messages, key)
        tiers.append(tier)
        messages.append({"role": "assistant", "content": answer})
    return tiers


def test_conversation_rises_to_the_strong_tier_once_and_stays(make_gateway, fake, artifact):
    embed = CountingEmbed()
    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=embed)
    assert converse(gw, [EASY, EASY, HARD, EASY, EASY]) == \
        ["small", "small", "large", "large", "large"]
    # the two turns kept on the strong tier were not scored
    assert embed.calls == 3
    records = gw.logged(5)
    assert [r["route_sticky"] for r in records] == [None, None, None, True, True]
    assert records[3]["route_score"] is None and records[3]["model_served"] == "large-upstream"


def test_a_tool_call_loop_is_not_scored_again_for_the_same_user_message(
        make_gateway, fake, artifact):
    embed = CountingEmbed()
    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=embed)
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": EASY}]
    assert turn(gw, messages)[0] == "small"
    for i in range(3):  # the assistant calls a tool; its result comes back
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "look", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": "42"}]
        assert turn(gw, messages)[0] == "small"
    assert embed.calls == 1
    assert [r["route_sticky"] for r in gw.logged(4)] == [None, True, True, True]


def test_a_new_conversation_is_scored_afresh(make_gateway, fake, artifact):
    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=CountingEmbed())
    assert converse(gw, [EASY, HARD, EASY]) == ["small", "large", "large"]
    # another opening message: another conversation
    assert converse(gw, ["Say hi", EASY]) == ["small", "small"]
    # a single request that opens alike is scored alone (it continues nothing)
    tier, _ = turn(gw, [SYSTEM, {"role": "user", "content": EASY}])
    assert tier == "small"


def test_another_gateway_key_keeps_its_own_tier(make_gateway, fake, artifact):
    keys = "".join(f'\n[[auth.keys]]\nid = "{k}"\n'
                   f'sha256 = "{hashlib.sha256(k.encode()).hexdigest()}"\n' for k in ("sk-a", "sk-b"))
    gw = make_gateway(MODELS + keys, policy=routing_policy(artifact), embed=CountingEmbed())
    assert converse(gw, [EASY, HARD, EASY], key="sk-a") == ["small", "large", "large"]
    assert converse(gw, [EASY, EASY, EASY], key="sk-b") == ["small", "small", "small"]


def test_without_sticky_every_turn_is_scored_alone(make_gateway, fake, artifact):
    gw = make_gateway(MODELS, policy=routing_policy(artifact, "sticky = false"),
                      embed=CountingEmbed())
    assert converse(gw, [EASY, HARD, EASY]) == ["small", "large", "small"]


def test_conversation_id_names_what_turns_share():
    chat = {"messages": [SYSTEM, {"role": "user", "content": "a"}]}
    opening, continues = conversation_id("key", "auto", chat)
    assert opening is not None and not continues
    later = {"messages": [*chat["messages"], {"role": "assistant", "content": "b"},
                          {"role": "user", "content": "c"}]}
    assert conversation_id("key", "auto", later) == (opening, True)
    assert conversation_id("other", "auto", later)[0] != opening
    assert conversation_id("key", "auto-2", later)[0] != opening
    assert conversation_id("key", "auto", {**later, "tools": [{"type": "function"}]})[0] \
        != opening
    assert conversation_id("key", "auto", {"messages": [SYSTEM]}) == (None, False)
    assert conversation_id("key", "auto", {"messages": "x"}) == (None, False)


def test_conversation_tiers_forget_by_age_and_bound():
    now = [0.0]
    tiers = ConversationTiers(ttl_s=10.0, max_entries=2, clock=lambda: now[0])
    tiers.put(b"a", "large")
    tiers.put(b"b", "small", b"scored")
    assert tiers.get(b"a") == ("large", None)
    tiers.put(b"c", "small")  # past the bound: the least recently used (b) goes
    assert tiers.get(b"b") == (None, None) and len(tiers) == 2
    now[0] = 11.0
    assert tiers.get(b"a") == (None, None)
