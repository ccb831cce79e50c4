"""Comparing a fresh answer with a cached one: the outcome the error bound learns from."""

from __future__ import annotations

import asyncio

import numpy as np

from gateway.cache.agreement import agree
from gateway.formats.answer import Answer
from tests.gateway.cache.test_cache_gateway import bag_of_words


def text(content: str | None) -> Answer:
    return Answer(content, "stop", "m")


def call(name: str, arguments: str) -> Answer:
    return Answer(None, "tool_calls", "m", [{"id": "c", "type": "function", "function": {
        "name": name, "arguments": arguments}}])


def run(a: Answer, b: Answer, embed: object = bag_of_words) -> bool | None:
    return asyncio.run(agree(a, b, embed))  # type: ignore[arg-type]


def test_the_same_text_up_to_case_and_punctuation_agrees() -> None:
    assert run(text("Paris is the capital of France."), text("paris is the capital of france"),
               None)


def test_other_numbers_disagree_whatever_the_wording() -> None:
    assert run(text("It boils at 100 degrees."), text("It boils at 212 degrees.")) is False


def test_a_rewording_agrees_by_embedding_and_another_answer_does_not() -> None:
    a = text("the capital of france is paris a city on the seine")
    assert run(a, text("the capital of france is paris a city on the seine river"))
    assert run(a, text("tokyo has many trains and tall buildings")) is False


def test_tool_calls_agree_when_functions_and_parsed_arguments_do() -> None:
    assert run(call("f", '{"x": 1, "y": 2}'), call("f", '{"y":2,"x":1}'))
    assert run(call("f", '{"x": 1}'), call("f", '{"x": 2}')) is False
    assert run(call("f", '{"x": 1}'), text("x is 1")) is False


def test_no_text_or_a_failing_embedder_gives_no_outcome() -> None:
    async def broken(texts: list[str]) -> np.ndarray:
        raise RuntimeError("embedder down")

    assert run(text(None), text("hello")) is None
    assert run(text("one thing"), text("another thing"), broken) is None
    assert run(text("one thing"), text("another thing"), None) is None
