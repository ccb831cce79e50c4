"""Units: how a context splits, what stays whole, and that writing it back is byte-exact."""

from __future__ import annotations

import json

import pytest

from gateway.compression.units import Run, protected_spans, render, split, units_of

DOCS = ("Answer from the documents.\n\n"
        "Document [1](Title: Alpha) alpha text\n"
        "Document [2](Title: Beta) beta text\n\nstill beta\n"
        "Document [3](Title: Gamma) gamma text")
MARKDOWN = ("# Setup\n\nInstall it with pip.\n\n"
            "1. first step\n2. second step\n   continued\n- a bullet\n\n"
            "```python\nx = 1\n\ny = 2\n```\n\n"
            "    indented code\n\n    more of it\n\n"
            "Last paragraph.")
KV = '{"k1": "v1",\n "k2": "v2",\n "k3": {"n": [1, 2]},\n "k4": "v4"}'
SMALL_JSON = 'Config:\n{"a": 1, "b": [1, 2, 3, 4, 5]}\nDone.'
BRACKETED = "[1] first source\n[2] second source\n\n[3] third source"

CASES = {
    "documents": (DOCS, [
        ("paragraph", "Answer from the documents."),
        ("document", "Document [1](Title: Alpha) alpha text"),
        ("document", "Document [2](Title: Beta) beta text\n\nstill beta"),
        ("document", "Document [3](Title: Gamma) gamma text")]),
    "bracketed documents": (BRACKETED, [
        ("document", "[1] first source"), ("document", "[2] second source"),
        ("document", "[3] third source")]),
    "markdown": (MARKDOWN, [
        ("section", "# Setup\n\nInstall it with pip."),
        ("item", "1. first step"), ("item", "2. second step\n   continued"),
        ("item", "- a bullet"),
        ("code", "```python\nx = 1\n\ny = 2\n```"),
        ("code", "    indented code\n\n    more of it"),
        ("paragraph", "Last paragraph.")]),
    "json records": (KV, [
        ("record", '"k1": "v1"'), ("record", '"k2": "v2"'),
        ("record", '"k3": {"n": [1, 2]}'), ("record", '"k4": "v4"')]),
    "small json whole": (SMALL_JSON, [
        ("paragraph", "Config:"), ("json", '{"a": 1, "b": [1, 2, 3, 4, 5]}'),
        ("paragraph", "Done.")]),
    "unclosed fence": ("Intro.\n\n```\ncode\n\nmore", [
        ("paragraph", "Intro."), ("code", "```\ncode\n\nmore")]),
}


@pytest.mark.parametrize("name", CASES)
def test_a_context_splits_into_the_expected_units(name):
    context, expected = CASES[name]
    units = units_of(split(context))
    assert [(u.kind, u.text) for u in units] == expected
    assert all(context[u.start:u.end] == u.text for u in units)


@pytest.mark.parametrize("name", CASES)
def test_keeping_every_unit_gives_the_context_back_byte_for_byte(name):
    context, _ = CASES[name]
    layout = split(context)
    assert render(layout, range(len(units_of(layout)))) == context


def test_a_document_marker_is_left_out_of_what_is_ranked():
    [_, first, *_] = units_of(split(DOCS))
    assert first.content == "(Title: Alpha) alpha text"


def test_json_records_drop_whole_and_the_rest_still_parses():
    layout = split(KV)
    assert [p for p in layout if isinstance(p, str)] == ["{", "}"]
    for kept in ([0, 2], [3], [1, 3], []):
        out = render(layout, kept)
        assert list(json.loads(out)) == [f"k{i + 1}" for i in sorted(kept)]


@pytest.mark.parametrize(("text", "spans"), [
    ("Paid 150,782 SEK in 1901.", ["150,782", "1901"]),
    ("see https://example.com/a?b=1) now", ["https://example.com/a?b=1"]),
    ("call `get_user(id)` then user_id and camelCase", ["`get_user(id)`", "user_id",
                                                        "camelCase"]),
    ('{"key": "a value", "n": 3.5}', ['"key"', '"a value"', '"n"', "3.5"]),
    ("uuid 2a8d601d-1d69-4e64-9f90-8ad825a74195.", ["2a8d601d-1d69-4e64-9f90-8ad825a74195"]),
    ("plain words only", []),
])
def test_protected_spans_find_numbers_urls_code_identifiers_and_strings(text, spans):
    assert [text[s:e] for s, e in protected_spans(text)] == spans


def test_a_protected_span_across_a_boundary_merges_the_units():
    context = "1. run `a\n2. b` now\n3. other"
    assert [u.text for u in units_of(split(context))] == ["1. run `a\n2. b` now", "3. other"]


@pytest.mark.parametrize("name", CASES)
def test_no_protected_span_crosses_a_unit_boundary(name):
    context, _ = CASES[name]
    units = units_of(split(context))
    for s, e in protected_spans(context):
        inside = [u for u in units if u.start < e and s < u.end]
        assert len(inside) <= 1
        assert all(u.start <= s and e <= u.end for u in inside)


def test_pinned_spans_become_fixed_text_in_place():
    context = DOCS + "\n\nQuestion: which one?"
    at = context.index("Question")
    layout = split(context, pinned=[(at, len(context))])
    assert layout[-1] == "Question: which one?"
    assert isinstance(layout[0], Run)
    assert render(layout, []).endswith("Question: which one?")


def test_reorderable_runs_follow_the_arrangement_other_runs_keep_their_order():
    docs, items = split(DOCS), split(MARKDOWN)
    [run] = docs
    assert isinstance(run, Run) and run.reorderable
    out = render(docs, [3, 1], arrange=lambda ranked: ranked)
    assert out == ("Document [3](Title: Gamma) gamma text\n"
                   "Document [1](Title: Alpha) alpha text")
    assert render(items, [2, 1], arrange=lambda ranked: ranked) == (
        "1. first step\n2. second step\n   continued")
