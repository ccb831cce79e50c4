"""A custom tool's text read from the function call an upstream made of it, as the call's
arguments stream in: given out piece by piece where the arguments open as ``{"input": "``,
whole at the end otherwise; never a piece that turns out wrong."""

from __future__ import annotations

import json

import pytest

from gateway.formats.tool_input import InputStream, custom_description, custom_input

PATCH = "*** Begin Patch\n*** Add File: a \"b\".txt\n+caf\u00e9 \U0001F600 \\o/\n*** End Patch"


def streamed(arguments: str, size: int) -> tuple[list[str], str, str]:
    """(the pieces given out as it came in ``size``-character pieces, the whole text, the
    rest given at the end)."""
    stream = InputStream()
    pieces = [stream.feed(arguments[i:i + size]) for i in range(0, len(arguments), size)]
    whole, rest = stream.rest()
    assert stream.arguments == arguments
    return [p for p in pieces if p], whole, rest


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 1000])
@pytest.mark.parametrize("arguments", [
    json.dumps({"input": PATCH}),  # escapes, \u sequences and a surrogate pair
    json.dumps({"input": PATCH}, ensure_ascii=False, separators=(",", ":")),
    ' { "input" :\n "' + PATCH.replace("\\", "\\\\").replace('"', '\\"').replace(
        "\n", "\n") + '" } ',  # raw newlines inside the string, as models write them
])
def test_the_text_streams_as_the_arguments_come(arguments: str, size: int) -> None:
    pieces, whole, rest = streamed(arguments, size)
    assert whole == PATCH
    assert "".join(pieces) + rest == PATCH
    assert rest == ""  # the closing quote ended it: nothing left for the end
    if size < 100:
        assert len(pieces) > 1


@pytest.mark.parametrize("arguments", [
    '{"patch": "abc"}', '["abc"]', "*** Begin Patch", '{"input": 3}', "",
])
def test_other_arguments_give_their_text_at_the_end(arguments: str) -> None:
    pieces, whole, rest = streamed(arguments, 2)
    assert pieces == [] and whole == rest == custom_input(arguments)


def test_a_broken_escape_stops_the_pieces_and_the_end_says_what_it_was() -> None:
    pieces, whole, rest = streamed('{"input": "ab\\qcd"}', 1)
    assert "".join(pieces) == "ab" and whole == '{"input": "ab\\qcd"}' and rest == ""


def test_a_lone_surrogate_is_replaced() -> None:
    pieces, whole, _ = streamed('{"input": "a\\ud83dz"}', 3)
    assert "".join(pieces) == whole == "a?z"


def test_the_grammar_is_told_in_the_description() -> None:
    regex = {"type": "grammar", "syntax": "regex", "definition": r"\d+"}
    assert custom_description("Count.", regex) == (
        "Count.\n\nThe input must match this regular expression:\n\\d+")
    assert custom_description(None, {"type": "grammar", "syntax": "ebnf",
                                     "definition": "x"}) == (
        "The input must follow this ebnf grammar:\nx")
    assert custom_description("Free.", None) == "Free."
