"""Relocation in both APIs: volatile text leaves the system prompt and tool descriptions and
ends the request, saying where it came from; the rest is left as it was."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.prompt_cache.relocate import (
    anthropic_append,
    anthropic_relocate,
    openai_append,
    openai_relocate,
)
from gateway.prompt_cache.volatile import Detector, Moved, scan
from gateway.testing.fake_anthropic import validate_request

DETECTOR = Detector()
TIME = "The current time is 2024-05-15 15:00:00 EST."
NOTE = f"Note from the system prompt: {TIME}"
RULES = "You are an airline agent.\nBe brief."


def relocate(source: str, text: str) -> tuple[str, list[Moved]]:
    found = scan(text, DETECTOR)
    return ("\n".join(found.lines), list(found.moved)) if found.moved else (text, [])


def openai(body: dict[str, Any]) -> dict[str, Any]:
    before = copy.deepcopy(body)
    out, notes = openai_relocate(body, relocate)
    assert body == before  # copies, never changes the client's body
    return openai_append(out, notes)


def anthropic(body: dict[str, Any]) -> dict[str, Any]:
    before = copy.deepcopy(body)
    out, notes = anthropic_relocate(body, relocate)
    out = anthropic_append(out, notes)
    assert body == before
    validate_request(out)
    return out


USER = {"role": "user", "content": "Change my flight."}


@pytest.mark.parametrize(("messages", "expected"), [
    # a system string: the line leaves, a final user message says where it came from
    ([{"role": "system", "content": f"{RULES}\n{TIME}"}, USER],
     [{"role": "system", "content": RULES}, USER, {"role": "user", "content": NOTE}]),
    # content parts, a developer message
    ([{"role": "developer", "content": [{"type": "text", "text": TIME},
                                        {"type": "text", "text": RULES}]}, USER],
     [{"role": "developer", "content": [{"type": "text", "text": RULES}]}, USER,
      {"role": "user", "content": NOTE}]),
    # a system message left empty goes away
    ([{"role": "system", "content": TIME}, {"role": "system", "content": RULES}, USER],
     [{"role": "system", "content": RULES}, USER, {"role": "user", "content": NOTE}]),
    # only the leading system messages are the static prefix; later ones are history
    ([{"role": "system", "content": RULES}, USER, {"role": "system", "content": TIME}],
     [{"role": "system", "content": RULES}, USER, {"role": "system", "content": TIME}]),
], ids=["string", "parts", "emptied", "later-system-kept"])
def test_openai_system_prompts(messages, expected):
    assert openai({"model": "m", "messages": messages})["messages"] == expected


def test_openai_tool_descriptions_and_nothing_to_move():
    tools = [{"type": "function", "function": {
        "name": "now", "description": "Clock.\nIt is 10:42 now.", "parameters": {}}}]
    out = openai({"model": "m", "messages": [USER], "tools": tools})
    assert out["tools"][0]["function"]["description"] == "Clock."
    assert out["messages"][-1] == {"role": "user", "content":
                                   "Note from the description of the tool now: It is 10:42 now."}
    plain = {"model": "m", "messages": [{"role": "system", "content": RULES}, USER]}
    assert openai(plain) == plain


def test_a_placeholder_is_named_in_the_note():
    text = "Rules: " + "be kind, " * 40 + "prices as of 2024-05-15 apply, " + "be kind " * 20
    out = openai({"model": "m", "messages": [{"role": "system", "content": text}, USER]})
    assert "prices as of [note 1] apply" in out["messages"][0]["content"]
    assert out["messages"][-1]["content"] == \
        "Note from the system prompt: [note 1] is 2024-05-15"


@pytest.mark.parametrize(("system", "expected"), [
    (f"{RULES}\n{TIME}", RULES),
    (TIME, None),  # nothing left: no system
    ([{"type": "text", "text": TIME}, {"type": "text", "text": RULES}],
     [{"type": "text", "text": RULES}]),
    # a block the client marked is kept, so its marker is not lost
    ([{"type": "text", "text": TIME, "cache_control": {"type": "ephemeral"}}],
     [{"type": "text", "text": "(moved to the end)", "cache_control": {"type": "ephemeral"}}]),
], ids=["string", "emptied", "blocks", "marked-block"])
def test_anthropic_system_prompts(system, expected):
    out = anthropic({"model": "m", "max_tokens": 8, "system": system, "messages": [USER]})
    assert out.get("system") == expected
    assert out["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Change my flight."}, {"type": "text", "text": NOTE}]}]


def test_anthropic_notes_end_the_last_user_turn_after_its_tool_results():
    messages = [USER,
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
                {"role": "assistant", "content": "Your flight"}]  # a prefill
    tools = [{"name": "now", "description": "Session id: 4f3a9c1b2d8e",
              "input_schema": {"type": "object"}}]
    out = anthropic({"model": "m", "max_tokens": 8, "system": TIME, "tools": tools,
                     "messages": messages})
    assert out["tools"][0]["description"] == ""
    assert out["messages"][:2] == messages[:2] and out["messages"][3] == messages[3]
    assert out["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
        {"type": "text", "text": NOTE + "\nNote from the description of the tool now: "
                                        "Session id: 4f3a9c1b2d8e"}]
