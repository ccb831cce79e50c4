"""Volatile lines: which whole lines count as metadata, and what a plan moves and leaves."""

from __future__ import annotations

import pytest

from gateway.prompt_cache.volatile import (
    LINE_MAX,
    MAX_LINES,
    Detector,
    Moved,
    fingerprints,
    plan,
)

DETECTOR = Detector()
RULES = "\n".join(f"Rule {i}: help the traveller with booking change {i}, politely."
                  for i in range(40))
TIME = "The current time is 2024-05-15 15:00:00 EST."


@pytest.mark.parametrize(("line", "kind"), [
    (TIME, "timestamp"),
    ("Current date: 2024-05-15", "timestamp"),
    ("Current date and time (UTC): 2024-05-15T10:00:00.123Z", "timestamp"),
    ("**Current date:** 2024-05-15", "timestamp"),
    ("[Current date: 2024-05-15]", "timestamp"),
    ("Today is Wednesday, May 15, 2024.", "timestamp"),
    ("Today is Monday", "timestamp"),
    ("Today's date is May 15th, 2024", "timestamp"),
    ("The current date is Wednesday, 15 May 2024.", "timestamp"),
    ("The date today is 15/05/2024.", "timestamp"),
    ("Now: 10:30 AM PST", "timestamp"),
    ("It is 3 pm.", "timestamp"),
    ("Current time: 1715785200", "timestamp"),
    ("The current time is now 09:41.", "timestamp"),
    ("Request ID: req_01HX9ABCDEF", "id"),
    ("Session id = 7f3a9c12", "id"),
    ("trace_id: 123e4567-e89b-12d3-a456-426614174000", "id"),
])
def test_metadata_lines_are_a_label_and_a_time_or_id(line, kind):
    assert DETECTOR.kind(line) == kind


@pytest.mark.parametrize("line", [
    # document text holding a date is not a statement of the request's time
    "Super Bowl LII took place on February 4, 2018 at U.S. Bank Stadium.",
    "Document [3](Title: Super Bowl LII) It was played on February 4, 2018.",
    "He was born January 2, 1926 in Ohio.",
    "It was May 15, 2018.",
    "It is 2018.",
    "Knowledge cutoff: 2023-10",  # not the request's time
    "Date: Mon, 4 Feb 2018",  # an e-mail header, not a label we know
    "Today is a good day.",
    "The current time is shown on the clock.",
    "Current date: see below",
    "Request ID: abc",  # an id holds a digit
    "The refund goes back in 5 to 7 business days.",
    "Cancel within 24 hours of booking.",
])
def test_other_lines_are_not(line):
    assert DETECTOR.kind(line) is None


def test_policy_patterns_mark_lines_holding_a_match():
    detector = Detector([r"Weather: \w+"])
    assert detector.kind("Weather: sunny") == "custom"
    assert detector.kind("Be brief.") is None


def test_a_metadata_line_standing_alone_moves_and_the_rest_is_left_byte_for_byte():
    text = f"# Policy\n\n{TIME}\n\n{RULES}"
    assert plan([text], DETECTOR.kind) == {
        text: (f"# Policy\n\n\n{RULES}", (Moved(TIME, "timestamp"),))}


@pytest.mark.parametrize("where", [
    "- {line}",  # a list item
    "  {line}",  # indented
    "| {line} | x |",  # a table row
    "```\n{line}\n```",  # code
    "{{\n  \"now\": 1,\n{line}\n}}",  # inside JSON
    "<document>\n{line}\n</document>",  # inside a tagged section
    "Document [2](Title: Log)\n{line}",  # a document's paragraph
    "> {line}",  # a quote
])
def test_a_metadata_line_inside_a_structure_stays(where):
    text = f"{RULES}\n\n" + where.format(line=TIME) + "\n\nBe kind."
    assert plan([text], DETECTOR.kind) == {}


def test_retrieval_documents_holding_dates_stay_where_they_are():
    docs = "\n".join(
        f"Document [{i}](Title: Event {i}) The event took place on February {i}, 2018 at "
        f"the stadium, and the current date is {i} May 2024." for i in range(1, 21))
    text = ("Write a high-quality answer for the given question using only the provided "
            f"search results (some of which might be irrelevant).\n\n{docs}")
    assert plan([text], DETECTOR.kind) == {}


def test_past_the_bounds_nothing_moves_at_all():
    stamps = [f"Current time: 10:0{i}" for i in range(MAX_LINES + 1)]
    rules = f"{RULES}\n{RULES}"
    assert plan(["\n".join([*stamps, rules])], DETECTOR.kind) == {}  # too many lines
    assert plan(["\n".join([*stamps[:MAX_LINES], rules])], DETECTOR.kind) != {}
    short = "Be brief and kind to every traveller.\n" + TIME  # over 5% of the prompt
    assert plan([short], DETECTOR.kind) == {}
    # 5% of the tokens: a date holds about twice the tokens of prose of its length, so a
    # line of 3% of the characters (over 6% of the tokens) stays.
    prose = "Help the traveller politely and in full sentences. " * 29
    assert 0.025 < len(TIME) / len(prose + TIME) < 0.03
    assert plan([f"{prose}\n{TIME}"], DETECTOR.kind) == {}
    assert plan([f"{prose * 2}\n{TIME}"], DETECTOR.kind) != {}
    long_line = "Current date: 2024-05-15 " + "x" * LINE_MAX
    assert plan([f"{RULES}\n{long_line}"], DETECTOR.kind) == {}


def test_a_text_that_is_only_metadata_stays_and_others_are_counted_together():
    assert plan([TIME, RULES], DETECTOR.kind) == {}  # moving it would empty its message
    both = f"{RULES}\n{TIME}"
    cut = plan([both, "Current date: 2024-05-15\n" + RULES], DETECTOR.kind)
    assert [moved for _, moved in cut.values()] == [
        (Moved(TIME, "timestamp"),), (Moved("Current date: 2024-05-15", "timestamp"),)]


def test_lines_seen_to_change_move_as_changed_under_the_same_rules():
    text = f"{RULES}\nWeather: rain\n- Weather: rain"
    changed = {hash("Weather: rain"), hash("- Weather: rain")}  # a list item never moves
    assert plan([text], DETECTOR.kind, changed) == {
        text: (f"{RULES}\n- Weather: rain", (Moved("Weather: rain", "changed"),))}


def test_fingerprints_are_one_per_line_with_a_separator_between_texts():
    assert len(fingerprints(["a\nb", "c"])) == 4
    assert fingerprints(["a"]) == [hash("a")]
