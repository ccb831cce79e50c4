"""Structured outputs and tool calls of a chat request: the grammar it gets, the 400s naming
the field, the call syntax parsed back into OpenAI deltas (whole and piece by piece)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from local_engine.errors import InvalidRequest
from local_engine.grammar import GrammarCompiler
from local_engine.openai_format import parse_chat
from local_engine.structured import (
    MAX_ITEMS,
    MAX_STRING,
    NUMBER_STEP,
    bounded,
    compile_structured,
    parse_structured,
)
from local_engine.tool_calls import CallParser, merge, render_call

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def refused(body: dict[str, Any], grammars: GrammarCompiler | None = None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        structured = parse_structured(body)
        if grammars is not None:
            compile_structured(grammars, structured)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "a b"}}]},
     "tools[1].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema"),
])
def test_what_the_engine_cannot_do_is_a_400_naming_the_field(body: dict[str, Any],
                                                              param: str) -> None:
    assert refused(body).param == param


def test_a_schema_the_library_rejects_is_named(char_grammars: GrammarCompiler) -> None:
    bad = {"type": "object", "properties": {"when": {"type": "string", "format": "moon"}}}
    err = refused({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": bad}}}, char_grammars)
    assert err.param == "response_format.json_schema.schema" and "moon" in str(err)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}
    err = refused({"tools": [WEATHER, tool], "tool_choice": "required"}, char_grammars)
    assert err.param == "tools[1].function.parameters" and "nope" in str(err)


def test_choices_that_need_no_grammar_and_one_that_is_cached(
        char_grammars: GrammarCompiler) -> None:
    assert parse_structured({}).grammar is None
    none = parse_structured({"tools": [WEATHER], "tool_choice": "none"})
    assert none.grammar is None and not none.functions
    auto = parse_structured({"tools": [WEATHER]})
    assert auto.calls and auto.functions[0]["name"] == "get_weather"
    first = compile_structured(char_grammars, auto)
    assert compile_structured(char_grammars, parse_structured({"tools": [WEATHER]})) is first


def test_unbounded_schemas_get_bounds_and_set_ones_are_kept() -> None:
    schema = {"type": "object", "properties": {
        "s": {"type": "string"}, "e": {"type": "string", "enum": ["x"]},
        "a": {"type": "array", "items": {"type": "string", "maxLength": 3}},
        "n": {"type": "integer", "minimum": 0}}}
    out = bounded(schema)
    props = out["properties"]
    assert out["additionalProperties"] is False and "additionalProperties" not in schema
    assert props["s"]["maxLength"] == MAX_STRING and "maxLength" not in props["e"]
    assert props["a"]["maxItems"] == MAX_ITEMS and props["a"]["items"]["maxLength"] == 3
    assert props["n"]["minimum"] == 0 and props["n"]["maximum"] == 2**53 - 1
    assert "multipleOf" not in props["n"]
    numbers = bounded({"type": "object", "properties": {
        "x": {"type": "number"}, "cents": {"type": "number", "multipleOf": 0.01}}})["properties"]
    assert numbers["x"] == {"type": "number", "maximum": 2**53 - 1, "minimum": -(2**53 - 1),
                            "multipleOf": NUMBER_STEP}
    assert numbers["cents"]["multipleOf"] == 0.01


def test_a_number_ends_within_six_decimal_places(char_grammars: GrammarCompiler) -> None:
    """A small model looping in a fraction's digits (seen: 2,048 tokens of "0.1212...")
    must still end its JSON."""
    schema = {"type": "object", "properties": {"score": {"type": "number"}},
              "required": ["score"]}
    grammar = compile_structured(char_grammars, parse_structured({"response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}))
    assert grammar is not None

    def takes(text: str) -> bool:
        matcher = grammar.matcher()
        return bool(matcher.consume_tokens([ord(c) - 32 for c in text])) \
            and not matcher.is_error()
    assert takes('{"score": 0.123456}') and takes('{"score": -12.5}')
    assert not takes('{"score": 0.1234567') and not takes('{"score": 1e300')


OUTPUT = (render_call("get_weather", '{"city": "Paris"}') + "\n"
          + render_call("lookup", '{"q": "a}</tool_call> b", "n": [1, 2]}'))


@pytest.mark.parametrize("piece", [1, 3, len(OUTPUT)])
def test_calls_parse_the_same_whole_or_streamed(piece: int) -> None:
    parser = CallParser()
    deltas = [d for i in range(0, len(OUTPUT), piece) for d in parser.feed(OUTPUT[i:i + piece])]
    content, calls = merge(deltas + parser.close())
    assert content == "" and parser.calls == 2
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("lookup", {"q": "a}</tool_call> b", "n": [1, 2]})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    heads = [d["tool_calls"][0] for d in deltas if "id" in d["tool_calls"][0]]
    assert [h["function"]["arguments"] for h in heads] == ["", ""]  # name first, then pieces


def test_text_is_content_and_a_call_cut_short_keeps_its_arguments() -> None:
    parser = CallParser()
    assert merge(parser.feed("Hello") + parser.feed(" <there>") + parser.close()) == (
        "Hello <there>", [])
    parser = CallParser()
    _, [call] = merge(parser.feed(OUTPUT[:60]) + parser.close())
    assert call["function"]["arguments"] == OUTPUT[len('<tool_call>{"name": "get_weather", '
                                                       '"arguments": '):60]


def test_tools_and_earlier_calls_are_written_into_the_prompt() -> None:
    chat = parse_chat({"model": "m", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]}, 16)
    system, _, assistant, tool = chat.messages
    assert system["role"] == "system" and '"name": "get_weather"' in system["content"]
    assert assistant["content"] == render_call("get_weather", '{"city": "Paris"}')
    assert tool == {"role": "tool", "content": "Sunny"}
    assert chat.structured.calls and chat.structured.grammar is not None
