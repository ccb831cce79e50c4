"""Relocation in both APIs: volatile lines leave the system prompt and end the request,
verbatim, under one marker line; the rest is left as it was."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.prompt_cache import relocate
from gateway.prompt_cache.relocate import MARKER
from gateway.prompt_cache.volatile import Cut, Detector, plan
from gateway.testing.fake_anthropic import validate_request

DETECTOR = Detector()
TIME = "The current time is 2024-05-15 15:00:00 EST."
BLOCK = f"{MARKER}\n{TIME}"
RULES = "\n".join(f"Rule {i}: help the traveller with booking change {i}, politely."
                  for i in range(40))


def planner(texts: list[str]) -> dict[str, Cut]:
    return plan(texts, DETECTOR.kind)


def openai(body: dict[str, Any]) -> dict[str, Any]:
    before = copy.deepcopy(body)
    out, _ = relocate.openai(body, planner)
    assert body == before  # copies, never changes the client's body
    return out


def anthropic(body: dict[str, Any]) -> dict[str, Any]:
    before = copy.deepcopy(body)
    out, moved = relocate.anthropic(body, planner)
    out = relocate.anthropic_append(out, moved)
    assert body == before
    validate_request(out)
    return out


USER = {"role": "user", "content": "Change my flight."}


@pytest.mark.parametrize(("messages", "expected"), [
    # a system string: the line leaves, the end of the user's message holds it verbatim
    ([{"role": "system", "content": f"{RULES}\n{TIME}"}, USER],
     [{"role": "system", "content": RULES},
      {"role": "user", "content": f"Change my flight.\n\n{BLOCK}"}]),
    # content parts, a developer message, a user message of parts: one more part
    ([{"role": "developer", "content": [{"type": "text", "text": f"{TIME}\n{RULES}"}]},
      {"role": "user", "content": [{"type": "text", "text": "Change my flight."}]}],
     [{"role": "developer", "content": [{"type": "text", "text": RULES}]},
      {"role": "user", "content": [{"type": "text", "text": "Change my flight."},
                                   {"type": "text", "text": BLOCK}]}]),
    # after tool results: a user message of its own
    ([{"role": "system", "content": f"{RULES}\n{TIME}"}, USER,
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                            "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
     [{"role": "system", "content": RULES}, USER,
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                            "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"},
      {"role": "user", "content": BLOCK}]),
    # a leading message with no content is left exactly as it came (no "content": null)
    ([{"role": "system"}, {"role": "system", "content": f"{RULES}\n{TIME}"}, USER],
     [{"role": "system"}, {"role": "system", "content": RULES},
      {"role": "user", "content": f"Change my flight.\n\n{BLOCK}"}]),
], ids=["string", "parts", "after-tool", "no-content"])
def test_openai_system_prompts(messages, expected):
    assert openai({"model": "m", "messages": messages})["messages"] == expected


@pytest.mark.parametrize("messages", [
    # a system message that is only the time: moving it would empty it
    [{"role": "system", "content": TIME}, {"role": "system", "content": RULES}, USER],
    # only the leading system messages are the static prefix; later ones are history
    [{"role": "system", "content": RULES}, USER, {"role": "system", "content": TIME}],
    # an assistant message to continue (a prefill): no end to put the time at
    [{"role": "system", "content": f"{RULES}\n{TIME}"}, USER,
     {"role": "assistant", "content": "Sure,"}],
    # nothing volatile
    [{"role": "system", "content": RULES}, USER],
], ids=["whole-message", "later-system", "prefill", "nothing"])
def test_openai_bodies_left_as_they_came(messages):
    body = {"model": "m", "messages": messages}
    assert openai(body) == body


def test_tool_descriptions_are_never_touched():
    tools = [{"type": "function", "function": {
        "name": "now", "description": f"Clock.\n{TIME}", "parameters": {}}}]
    body = {"model": "m", "messages": [{"role": "system", "content": RULES}, USER],
            "tools": tools}
    assert openai(body) == body


@pytest.mark.parametrize(("system", "expected"), [
    (f"{RULES}\n{TIME}", RULES),
    ([{"type": "text", "text": f"{TIME}\n{RULES}"}, {"type": "text", "text": "Be brief."}],
     [{"type": "text", "text": RULES}, {"type": "text", "text": "Be brief."}]),
], ids=["string", "blocks"])
def test_anthropic_system_prompts(system, expected):
    out = anthropic({"model": "m", "max_tokens": 8, "system": system, "messages": [USER]})
    assert out["system"] == expected
    assert out["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Change my flight."}, {"type": "text", "text": BLOCK}]}]


@pytest.mark.parametrize("system", [
    TIME,  # nothing would be left
    # a block the client marked for caching is the client's choice of prefix
    [{"type": "text", "text": f"{RULES}\n{TIME}", "cache_control": {"type": "ephemeral"}}],
], ids=["only-time", "marked-block"])
def test_anthropic_system_prompts_left_alone(system):
    body = {"model": "m", "max_tokens": 8, "system": system, "messages": [USER]}
    assert anthropic(body) == body


def test_anthropic_block_ends_the_last_user_turn_after_its_tool_results():
    messages = [USER,
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}]
    out = anthropic({"model": "m", "max_tokens": 8, "system": f"{RULES}\n{TIME}",
                     "messages": messages})
    assert out["messages"][:2] == messages[:2]
    assert out["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
        {"type": "text", "text": BLOCK}]
    prefill = {"model": "m", "max_tokens": 8, "system": f"{RULES}\n{TIME}",
               "messages": [USER, {"role": "assistant", "content": "Your flight"}]}
    assert anthropic(prefill) == prefill
