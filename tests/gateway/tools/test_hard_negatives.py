"""Each hard-pair rule makes the change it names, and only where it applies."""

from __future__ import annotations

import random

import pytest

from gateway.tools.hard_negatives import (
    NEGATIVE_KINDS,
    RULES,
    change_entity,
    change_negation,
    change_number,
    change_scope,
    generate,
    rewrite,
    swap_direction,
)


@pytest.mark.parametrize(("text", "swapped"), [
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
    ("How do I get from Delhi to Mumbai?", "How do I get from Mumbai to Delhi?"),
    ("Translate English to French", "Translate French to English"),
    ("Python vs Java for beginners?", "Java vs Python for beginners?"),
    ("Was Hillary's letter to Obama leaked?", "Was Obama's letter to Hillary leaked?"),
    ("How can I convert html to pdf?", "How can I convert pdf to html?"),
])
def test_direction_swaps_the_two_sides(text: str, swapped: str) -> None:
    assert swap_direction(text) == swapped


@pytest.mark.parametrize("text", ["How do I learn to swim?", "What is the best way to cook?",
                                  "How do I send money from abroad to a bank account?"])
def test_direction_leaves_other_uses_of_to_alone(text: str) -> None:
    assert swap_direction(text) is None


def test_number_changes_a_number_unit_or_date() -> None:
    rng = random.Random(0)
    for text, kept in [("How long does it take to run 10 km?", "How long does it take to run"),
                       ("What happened in 2016 in India?", "What happened in "),
                       ("Is 5 kg a lot?", "Is "), ("What happens in May?", "What happens in ")]:
        changed = change_number(text, rng)
        assert changed is not None and changed != text and changed.startswith(kept)
    assert change_number("Why is the sky blue?", rng) is None


@pytest.mark.parametrize(("text", "changed"), [
    ("Why can't I sleep?", "Why can I sleep?"),
    ("Is it safe to eat eggs?", "Isn't it safe to eat eggs?"),
    ("Why do birds sing?", "Why don't birds sing?"),
    ("Why is the sky not blue?", "Why is the sky blue?"),
])
def test_negation_is_added_or_removed(text: str, changed: str) -> None:
    assert change_negation(text) == changed


def test_entity_is_swapped_within_its_category() -> None:
    changed = change_entity("How do I get a job in Canada?", random.Random(0))
    assert changed is not None and changed.startswith("How do I get a job in ")
    assert changed.removeprefix("How do I get a job in ").rstrip("?") in {
        "India", "China", "France", "Germany", "Japan", "Australia", "Brazil", "Russia",
        "Italy", "Spain", "Mexico", "Pakistan", "USA", "UK", "America", "England",
        "Singapore", "Nepal", "Sweden", "Ireland", "Israel"}
    assert change_entity("How do I bake bread?", random.Random(0)) is None


def test_scope_word_is_flipped() -> None:
    rng = random.Random(0)
    assert change_scope("What should I do before an interview?", rng) == \
        "What should I do after an interview?"
    assert change_scope("Are all cats black?", rng) == "Are some cats black?"
    assert change_scope("Why is the sky blue?", rng) is None


@pytest.mark.parametrize(("text", "rewritten"), [
    ("What is the capital of France?", {"What's the capital of France?",
                                        "What is the capital city of France?"}),
    ("How do I learn Python?", {"How can I learn Python?"}),
    ("What's a good movie?", {"What is a good movie?", "What's a good film?"}),
])
def test_rewrite_keeps_the_meaning(text: str, rewritten: set[str]) -> None:
    assert rewrite(text, random.Random(0)) in rewritten


def test_generate_labels_each_kind_and_respects_the_cap() -> None:
    texts = ["How do I convert Celsius to Fahrenheit?", "What is the capital of France?",
             "Why can't I sleep at 3 am in India?", "What is the best movie of 2016?"]
    pairs = generate(texts, random.Random(0), per_kind=1)
    kinds = {p.kind for p in pairs}
    assert kinds == set(RULES)
    assert all(p.label == (0 if p.kind in NEGATIVE_KINDS else 1) for p in pairs)
    assert all(p.a != p.b for p in pairs)
    assert len(pairs) == len(RULES)
    assert generate(texts, random.Random(0), 1) == pairs  # deterministic
