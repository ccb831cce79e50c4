"""Model patterns and templates (gateway.model_patterns): what an id matches, what each
``*`` took, what the upstream is sent, which pattern comes first, and which overlap."""

from __future__ import annotations

import re
import time

import pytest

from gateway.model_patterns import (
    MAX_ID_CHARS,
    ModelPattern,
    Template,
    by_precedence,
    overlap,
)


@pytest.mark.parametrize(("pattern", "model", "groups"), [
    ("claude-*", "claude-sonnet-4-5-20250929", ("sonnet-4-5-20250929",)),
    ("claude-*", "claude-haiku-4-5", ("haiku-4-5",)),
    ("anthropic/*", "anthropic/claude-x", ("claude-x",)),
    ("*", "anything at all", ("anything at all",)),
    ("gpt-*-codex", "gpt-5.1-codex", ("5.1",)),
    ("*-*", "a-b-c", ("a", "b-c")),  # each star but the last: the shortest run
    ("a*a", "ababa", ("bab",)),
    # the whole id, one character at least per star
    ("claude-*", "claude-", None),
    ("claude-*", "xclaude-a", None),
    ("claude-*", "Claude-a", None),
    ("*-latest", "claude-latest-2", None),
    ("a*a", "aa", None),
    ("*-*-*", "a--b", None),
    ("claude-*", "claude-" + "x" * MAX_ID_CHARS, None),  # too long to be an id
])
def test_a_pattern_matches_whole_ids_and_says_what_each_star_took(pattern, model, groups):
    assert ModelPattern(pattern).match(model) == groups


def test_matching_a_long_id_against_many_stars_is_linear():
    """No backtracking expression: a near miss costs a scan, not a combinatorial search."""
    pattern = ModelPattern("a*b*c*d*e*f*g*h*i")
    model = ("ab" + "c" * 120 + "d" * 120)[:MAX_ID_CHARS]
    started = time.perf_counter()
    for _ in range(100):
        assert pattern.match(model) is None
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("bad", ["claude-**", "no-star", "x" * 129 + "*"])
def test_a_pattern_that_cannot_be_one_is_refused(bad):
    with pytest.raises(ValueError):
        ModelPattern(bad)


@pytest.mark.parametrize(("template", "stars", "model", "groups", "sent"), [
    ("{model}", 1, "claude-haiku-4-5", ("haiku-4-5",), "claude-haiku-4-5"),
    ("{1}", 1, "anthropic/claude-x", ("claude-x",), "claude-x"),
    ("openai/{2}-{1}", 2, "a-b", ("a", "b"), "openai/b-a"),
    ("fixed-model", 1, "claude-x", ("x",), "fixed-model"),
])
def test_a_template_makes_the_upstream_model(template, stars, model, groups, sent):
    assert Template(template, stars).render(model, groups) == sent


def test_a_template_without_placeholders_is_a_fixed_model():
    assert Template("fixed-model", 1).literal == "fixed-model"
    assert Template("{model}", 1).literal is None


@pytest.mark.parametrize(("template", "message"), [
    ("{2}", "unknown placeholder {2}; the pattern has 1 '*': use {model} or {1}"),
    ("{0}", "unknown placeholder {0}"),
    ("{name}", "unknown placeholder {name}"),
    ("a{", "a lone '{' or '}'"),
    ("}", "a lone '{' or '}'"),
    ("", "an empty model"),
])
def test_a_bad_template_is_refused_with_what_is_wrong(template, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Template(template, 1)


def test_the_most_literal_pattern_comes_first_then_the_config_order():
    written = [ModelPattern(p) for p in ("*", "claude-*", "*-latest", "claude-haiku-*",
                                         "claude-*-4-5")]
    assert [p.text for p in by_precedence(written)] == [
        "claude-haiku-*", "claude-*-4-5", "claude-*", "*-latest", "*"]


@pytest.mark.parametrize(("a", "b", "example"), [
    ("claude-*", "claude-haiku-*", "claude-haiku-x"),
    ("claude-*", "*-latest", "claude-latest"),
    ("*", "gpt-*", "gpt-x"),
    ("*a*", "*b*", "xabx"),
    ("ab*", "*ab", "abab"),
    ("claude-*", "gpt-*", None),
    ("a*b", "b*a", None),
    ("x*y", "*z", None),
])
def test_two_patterns_overlap_when_an_id_matches_both(a, b, example):
    found = overlap(ModelPattern(a), ModelPattern(b))
    assert found == example
    if found is not None:
        assert ModelPattern(a).match(found) and ModelPattern(b).match(found)
