"""One request's shaping, per upstream API: what the policy enables and nothing else, the
OpenAI ``prompt_cache_key``, what one key's history may and may not change."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.formats.openai_to_anthropic import anthropic_request
from gateway.policy import PromptCachePolicy
from gateway.prompt_cache.cache_keys import CacheKeys
from gateway.prompt_cache.memory import PromptMemory
from gateway.prompt_cache.relocate import MARKER, system_texts
from gateway.prompt_cache.shape import Shaping
from gateway.requestlog import RequestRecord
from gateway.stages.prompt_cache import settings
from gateway.testing.fake_anthropic import validate_request

RULES = "\n".join(f"Rule {i}: help the traveller with their booking number {i}."
                  for i in range(30))
NOW = "Current time: 2024-05-15 10:00"
TOOLS = [{"type": "function", "function": {
    "name": n, "description": f"The {n} tool.",
    "parameters": {"type": "object", "properties": {"b": {"type": "string"},
                                                    "a": {"type": "string"}}}}}
    for n in ("search", "book", "cancel")]


def chat(system: str = RULES, turns: int = 1, **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for i in range(turns):
        if i:
            messages.append({"role": "assistant", "content": f"answer {i}"})
        messages.append({"role": "user", "content": f"question {i}"})
    return {"model": "gpt", "messages": messages, "tools": TOOLS, **extra}


class Gateway:
    """The stage's state across requests, and one request's shaping at a time."""

    def __init__(self, **policy: Any) -> None:
        self.settings = settings(PromptCachePolicy(**policy))
        self.memory = PromptMemory()
        self.keys = CacheKeys(b"s" * 32)

    def shape(self, body: dict[str, Any], api: str = "openai", key: str | None = "k1",
              client_api: str = "openai") -> tuple[dict[str, Any], RequestRecord]:
        record = RequestRecord("r", "/")
        shaping = Shaping(self.settings, self.memory, self.keys, record, key, "m", body,
                          client_api)
        if api == "anthropic" and client_api == "openai":
            body = anthropic_request(body, "claude-x", 64)
        out = shaping(body, api)
        if api == "anthropic":
            validate_request(out)
        shaping.commit()
        return out, record


def test_openai_bodies_get_tools_sorted_the_time_moved_and_a_cache_key():
    gw = Gateway()
    out, rec = gw.shape(chat(system=f"{RULES}\n{NOW}"))
    assert [t["function"]["name"] for t in out["tools"]] == ["book", "cancel", "search"]
    assert list(out["tools"][0]["function"]["parameters"]["properties"]) == ["a", "b"]
    assert out["messages"][0]["content"] == RULES
    assert out["messages"][-1] == {"role": "user", "content": f"question 0\n\n{MARKER}\n{NOW}"}
    assert out["prompt_cache_key"].startswith("gw-") and len(out["prompt_cache_key"]) == 19
    assert (rec.prompt_cache_breakpoints, rec.prompt_cache_moved) == (0, {"timestamp": 1})


def test_the_cache_key_follows_the_static_prefix_and_the_gateway_key():
    gw = Gateway()

    def key(body: dict[str, Any], **kw: Any) -> str:
        return str(gw.shape(body, **kw)[0]["prompt_cache_key"])

    first = key(chat(system=RULES + "\nNow: 10:00"))
    # Another conversation, another time, tools in another order: the same prefix, the key.
    assert key(chat(system=RULES + "\nNow: 11:30", turns=3, tools=TOOLS[::-1])) == first
    assert key(chat(system="Another agent.")) != first
    # Another conversation (another opening message) keeps its own cache machine.
    opened = chat(system=RULES + "\nNow: 10:00")
    opened["messages"][1] = {"role": "user", "content": "another question"}
    assert key(opened) != first
    assert key(chat(system=RULES + "\nNow: 10:00"), key="k2") != first
    # A time that cannot move (here inside a list) is part of the prefix.
    assert key(chat(system=RULES + "\n- Now: 10:00")) != key(chat(system=RULES + "\n- Now: 11:30"))
    assert key(chat(prompt_cache_key="mine")) == "mine"  # the client's own stays (the door
    # namespaced it already: tests/gateway/security/test_tenants.py)
    # an HMAC under the deployment's secret: another secret, another key
    other = Gateway()
    other.keys = CacheKeys(b"t" * 32)
    assert str(other.shape(chat(system=RULES + "\nNow: 10:00"))[0]["prompt_cache_key"]) != first
    assert "prompt_cache_key" not in Gateway(openai_cache_key=False).shape(chat())[0]
    assert "prompt_cache_key" not in gw.shape(chat(), api="anthropic")[0]


def test_with_every_transform_off_the_body_is_the_clients():
    gw = Gateway(sort_tools=False, relocate_volatile=False, breakpoints=False,
                 openai_cache_key=False)
    body = chat(system=f"{RULES}\n{NOW}")
    assert gw.shape(body)[0] == body
    out, rec = gw.shape(body, api="anthropic")
    assert out == anthropic_request(body, "claude-x", 64)
    assert (rec.prompt_cache_breakpoints, rec.prompt_cache_moved) == (0, {})


def test_a_line_that_changes_between_requests_moves_only_for_that_key():
    gw = Gateway()
    for weather in ("sunny", "rain"):  # seen to change once: not yet evidence
        out, rec = gw.shape(chat(system=f"{RULES}\nWeather: {weather}"))
        assert out["messages"][0]["content"] == f"{RULES}\nWeather: {weather}"
    out, rec = gw.shape(chat(system=RULES + "\nWeather: snow", turns=2))
    assert out["messages"][0]["content"] == RULES
    assert out["messages"][-1]["content"] == f"question 1\n\n{MARKER}\nWeather: snow"
    assert rec.prompt_cache_moved == {"changed": 1}
    # Another key saw none of it: its first request is sent as the client wrote it.
    other, rec = gw.shape(chat(system=RULES + "\nWeather: snow"), key="k2")
    assert other["messages"][0]["content"] == RULES + "\nWeather: snow"
    assert rec.prompt_cache_moved == {}


def test_anthropic_bodies_translated_from_openai_get_markers_and_the_note_last():
    gw = Gateway(default_min_tokens=50)
    body = chat(system=f"{RULES}\n{NOW}", turns=2)
    out, rec = gw.shape(body, api="anthropic")
    assert list(out)[:5] == ["model", "max_tokens", "tools", "system", "messages"]
    assert out["system"] == [{"type": "text", "text": RULES,
                              "cache_control": {"type": "ephemeral"}}]
    assert "cache_control" in out["tools"][-1] and out["tools"][-1]["name"] == "search"
    last = out["messages"][-1]["content"]
    assert last == [{"type": "text", "text": "question 1", "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": f"{MARKER}\n{NOW}"}]
    assert (rec.prompt_cache_breakpoints, rec.prompt_cache_moved) == (3, {"timestamp": 1})


def test_the_lookback_marker_comes_from_this_keys_own_history():
    gw = Gateway(default_min_tokens=50, lookback_blocks=4)
    gw.shape(chat(turns=2), api="anthropic")
    long = chat(turns=6)  # the tail 8 blocks past the last request's
    mine, rec = gw.shape(long, api="anthropic")
    assert rec.prompt_cache_breakpoints == 4
    assert "cache_control" in mine["messages"][2]["content"][0]  # where the last tail was
    _, rec = gw.shape(long, api="anthropic", key="k2")
    assert rec.prompt_cache_breakpoints == 3  # no history: no lookback marker


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_system_texts_read_either_api(api):
    body = chat(system=RULES)
    if api == "anthropic":
        body = anthropic_request(body, "c", 8)
    assert system_texts(body, api) == [RULES]


def test_a_metadata_line_seen_holding_still_stays_in_place():
    gw = Gateway()
    # First seen: a time line moves (the prefix before it stays the same if it changes).
    out, rec = gw.shape(chat(system=f"{RULES}\n{NOW}"))
    assert out["messages"][0]["content"] == RULES and rec.prompt_cache_moved == {"timestamp": 1}
    # The same prompt again, every line alike (a recorded agent's clock, a date all day):
    # moving it would only cost the conversation's cached tail, so it stays.
    for turns in (2, 3):
        out, rec = gw.shape(chat(system=f"{RULES}\n{NOW}", turns=turns))
        assert out["messages"][0]["content"] == f"{RULES}\n{NOW}"
        assert out["messages"][-1]["content"] == f"question {turns - 1}"
        assert rec.prompt_cache_moved == {}
    # Another key has seen nothing: it moves there.
    assert gw.shape(chat(system=f"{RULES}\n{NOW}"), key="k2")[1].prompt_cache_moved == {
        "timestamp": 1}
