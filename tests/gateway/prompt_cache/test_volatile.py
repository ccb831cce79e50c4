"""Volatile spans: what the patterns find and leave alone, and what a scan leaves behind."""

from __future__ import annotations

import re

import pytest

from gateway.prompt_cache.volatile import (
    BUILTIN,
    LINE_MAX,
    Detector,
    Moved,
    line_hashes,
    scan,
    take_lines,
)

DETECTOR = Detector()


@pytest.mark.parametrize(("text", "span", "kind"), [
    ("The current time is 2024-05-15 15:00:00 EST.", "2024-05-15 15:00:00 EST", "timestamp"),
    ("now: 2024-05-15T15:00:00.123Z", "2024-05-15T15:00:00.123Z", "timestamp"),
    ("Date: 05/15/2024", "05/15/2024", "timestamp"),
    ("Datum: 15.05.2024, 14:30", "15.05.2024, 14:30", "timestamp"),
    ("Date: Wednesday, May 15th, 2024 at 3:04 PM.", "Wednesday, May 15th, 2024 at 3:04 PM",
     "timestamp"),
    ("as of 15 March 2024", "15 March 2024", "timestamp"),
    ("Knowledge cutoff: May 2024", "May 2024", "timestamp"),
    ("Remember: it is Monday", "it is Monday", "timestamp"),
    ("Local time 09:41", "09:41", "timestamp"),
    ("Call back at 3pm", "3pm", "timestamp"),
    ("ts=1715785200", "1715785200", "timestamp"),
    ("ts=1715785200123", "1715785200123", "timestamp"),
    ("uuid 123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-426614174000",
     "uuid"),
    ("Request id: 7f3a9c1b2d", "Request id: 7f3a9c1b2d", "id"),
    ("session_id=ab12cd34", "session_id=ab12cd34", "id"),
    ("trace 4bf92f3577b34da6a3ce929d0e0e4736", "4bf92f3577b34da6a3ce929d0e0e4736", "id"),
    ("reply to msg_01XFDUDYJgAACzvnptvVoYEL", "msg_01XFDUDYJgAACzvnptvVoYEL", "id"),
    ("This is request #123.", "request #123", "counter"),
    ("Requests: 42", "Requests: 42", "counter"),
    ("turn count: 5", "turn count: 5", "counter"),
    ("We are at turn 7 now", "turn 7", "counter"),
])
def test_the_patterns_find_dates_times_ids_and_counters(text, span, kind):
    [(start, end, found)] = DETECTOR.spans(text)
    assert (text[start:end], found) == (span, kind)


@pytest.mark.parametrize("text", [
    "Step 1: greet the user.",
    "The refund goes back in 5 to 7 business days.",
    "Cancel within 24 hours of booking.",
    "Requires Python 3.11.2 or later.",
    "The office is closed on Sunday.",
    "A ratio of 16:9.",
    "$100 times the number of passengers.",
    "Use session_management for that.",
    "You may 2 times ask.",
])
def test_stable_text_is_left_alone(text):
    assert DETECTOR.spans(text) == []


def test_the_fast_path_finds_what_one_big_regex_would():
    # Spans are looked for only near digits and weekday names; the same texts through the
    # plain alternation of every pattern give the same spans.
    every = re.compile("|".join(f"({regex})" for _, regex in BUILTIN))
    texts = ["Today is Wednesday, May 15th, 2024 at 3:04 PM. Ticket #45, request number 7.",
             "héllo 2024-01-01 ü, ids deadbeefcafebabe12 and call_abc123def (2024-05-15)",
             "Sep. 5 and 5 Sep 2024; 12/31/99 then 23:59:59+02:00; ratio 4:3"]
    for text in texts:
        assert [s[:2] for s in DETECTOR.spans(text)] == [m.span() for m in every.finditer(text)]


def test_policy_patterns_add_custom_spans_and_overlaps_go_to_the_first():
    detector = Detector([r"Weather: \w+", r"\d{4}-\d{2}"])
    assert detector.spans("Weather: sunny. Date 2024-05-15.") == [
        (0, 14, "custom"), (21, 31, "timestamp")]
    assert Detector([r"x*"]).spans("abc") == []  # empty matches count not


def test_a_short_line_leaves_whole_and_nothing_is_left_in_its_place():
    text = "# Policy\n\nThe current time is 2024-05-15 15:00:00 EST.\n\nBe kind."
    found = scan(text, DETECTOR)
    assert "\n".join(found.lines) == "# Policy\n\n\nBe kind."
    assert found.moved == (Moved("The current time is 2024-05-15 15:00:00 EST.",
                                 ("timestamp",)),)


def test_a_long_line_loses_the_sentence_around_the_span():
    head = "You are a support agent for Acme and you answer briefly. " * 3
    text = head + "Today is 2024-05-15. Always be polite."
    assert len(text) > LINE_MAX
    found = scan(text, DETECTOR)
    assert found.lines == (head + "Always be polite.",)
    assert found.moved == (Moved("Today is 2024-05-15.", ("timestamp",)),)


def test_a_span_in_a_very_long_sentence_leaves_a_numbered_placeholder():
    text = "Intro " + "word " * 60 + "as of 2024-05-15 and id 4bf92f3577b34da6 " + \
        "more " * 60 + "end."
    found = scan(text, DETECTOR)
    assert "as of [note 1] and id [note 2] more" in found.lines[0]
    assert found.moved == (Moved("2024-05-15", ("timestamp",), 1),
                           Moved("4bf92f3577b34da6", ("id",), 2))


def test_a_text_without_spans_scans_to_its_own_lines():
    found = scan("a\nb\n", DETECTOR)
    assert found.lines == ("a", "b", "") and found.moved == ()


def test_flagged_lines_leave_whole_as_changed():
    lines = ["Be brief.", "Weather: sunny", ""]
    flagged = set(line_hashes("system", ["Weather: sunny"]))
    kept, moved = take_lines("system", lines, flagged)
    assert kept == ["Be brief.", ""] and moved == [Moved("Weather: sunny", ("changed",))]
    # The same line from another source is another fingerprint.
    assert take_lines("tool:x", lines, flagged) == (lines, [])
    assert line_hashes("system", ["a", " ", ""]) == [hash(("system", "a"))]
