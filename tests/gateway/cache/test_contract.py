"""The contract veto: pairs that differ in a number, a negation, a name, a direction or a
polarity word never share an answer; paraphrases pass."""

from __future__ import annotations

import random

import pytest

from gateway.cache.contract import terms, veto
from gateway.tools.hard_negatives import generate


def why(a: str, b: str) -> str | None:
    return veto(terms(a), terms(b))


@pytest.mark.parametrize(("a", "b", "reason"), [
    ("How many km is 10 miles?", "How many km is 12 miles?", "number"),
    ("What is 5 kg in grams?", "What is 5 pounds in grams?", "number"),
    ("Best places to visit in May?", "Best places to visit in August?", "number"),
    ("What are the top 10 movies of 2016?", "What are the top 10 movies of 2017?", "number"),
    ("Is GPT-4 better at math?", "Is GPT-3 better at math?", "number"),
    ("Why can't I sleep at night?", "Why can I sleep at night?", "negation"),
    ("Is it safe to drink tap water?", "Isn't it safe to drink tap water?", "negation"),
    ("How do I find jobs in India?", "How do I find jobs in Canada?", "entity"),
    ("how do i find jobs in india?", "how do i find jobs in canada?", "entity"),
    ("How was the debate between Trump and Clinton?",
     "How was the debate between Trump and Trump?", "entity"),
    ("What does parse_config return?", "What does load_config return?", "entity"),
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?",
     "direction"),
    ("How do I translate 你好 into English?", "How do I translate English into 你好?",
     "direction"),
    ("How do I move from Java to Python?", "How do I move from Python to Java?", "direction"),
    ("What should I do before an interview?", "What should I do after an interview?",
     "polarity"),
    ("What are the advantages of remote work?", "What are the disadvantages of remote work?",
     "polarity"),
])
def test_a_pair_that_asks_something_else_is_vetoed(a: str, b: str, reason: str) -> None:
    assert why(a, b) == reason
    assert why(b, a) == reason


@pytest.mark.parametrize(("a", "b"), [
    ("What is the capital of France?", "What's the capital city of France?"),
    ("How do I learn Python quickly?", "How can I learn python fast?"),
    ("How can you define life in 2 words?", "What is the meaning of life in two words?"),
    ("How does one lose weight?", "What is the best way to lose weight?"),
    ("Why don't cats like water?", "Why do cats not like water?"),
    ("What Is The Best Way To Learn Guitar?", "How should I learn the guitar?"),
    ("How do I download a playlist from YouTube?", "How can I download a Youtube playlist?"),
])
def test_a_paraphrase_keeps_the_contract(a: str, b: str) -> None:
    assert why(a, b) is None


def test_rule_made_negatives_are_vetoed_and_rewrites_pass() -> None:
    texts = [
        "How do I convert Celsius to Fahrenheit?", "How do I move from Java to Python?",
        "What is the best laptop under 500 dollars in 2016?", "Why can't I sleep at night?",
        "Is it safe to travel to India in May?", "What are jobs like at Google in London?",
        "How do I improve my English before the exam?", "What is the best movie of 2015?",
        "How can I start a business in Canada with 10000 dollars?",
    ]
    pairs = generate(texts, random.Random(0))
    for p in pairs:
        if p.kind in ("number", "negation", "entity", "direction"):
            assert why(p.a, p.b) is not None, p
    rewrites = [p for p in pairs if p.kind == "rewrite"]
    assert rewrites and all(why(p.a, p.b) is None for p in rewrites)


def test_any_text_gives_terms() -> None:
    for text in ("", "?", "   ", "\u0000\ud7ff", "1,000.0 km", "a" * 10_000, "İs it?"):
        assert veto(terms(text), terms(text)) is None
