"""The fine pass: words dropped by their information, protected spans byte for byte, text
that stays well formed, the budget; and ``compress`` with it (pinned text untouched, the
coarse result whenever scoring fails)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from gateway.compression import compress
from gateway.compression.fine import FineOptions, Piece, Scored, cut, fine, pieces
from gateway.compression.scoring import ScoringFailed
from gateway.compression.tokens import o200k
from gateway.compression.units import protected_spans
from tests.gateway.compression.test_compress import documents, keyword_embed, records

#: Words a language model would find easy to guess: cheap to drop.
FILLER = {"the", "a", "of", "and", "was", "is", "at", "on", "more", "about", "follows",
          "here", "see", "units", "measured"}
_TOKENS = re.compile(r" ?\w+| ?[^\w\s]|\s+")


def tokenize(text: str) -> list[tuple[int, str]]:
    """A fake tokenizer: a word a token, with its leading space; punctuation and line
    breaks stand alone."""
    return [(m.start(), m.group()) for m in _TOKENS.finditer(text)]


class FakeScorer:
    """Filler words are likely (-0.1 nats a token), every other token unlikely (-5)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def __call__(self, texts: list[str]) -> list[Scored]:
        self.calls.append(texts)
        out = []
        for text in texts:
            tokens = tokenize(text)
            words = [re.sub(r"\W", "", t).lower() for _, t in tokens]
            logprobs = [-0.1 if w in FILLER else -5.0 for w in words]
            logprobs[0] = np.nan
            out.append(Scored(np.array([s for s, _ in tokens]), np.array(logprobs)))
        return out


async def failing(texts: list[str]) -> list[Scored]:
    raise ScoringFailed("the engine answered 503")


def scored(text: str, logprobs: list[float]) -> Scored:
    return Scored(np.array([s for s, _ in tokenize(text)]), np.array(logprobs))


def test_tokens_group_into_words_and_what_may_go_is_ruled():
    text = "He was born in 1961 in Honolulu, near_here.\nThe island"
    words = pieces(text, scored(text, [np.nan] + [-1.0] * (len(tokenize(text)) - 1)),
                   protected_spans(text))
    by_text = {text[p.start:p.end]: p for p in words}
    assert [text[p.start:p.end] for p in words] == [
        "He", " was", " born", " in", " 1961", " in", " Honolulu", ",", " near_here", ".",
        "\n", "The", " island"]
    assert by_text[" Honolulu"].tokens == 1 and by_text[" Honolulu"].info == 1.0
    assert not by_text["He"].droppable  # the first token: no prefix, no score
    assert not by_text[" 1961"].droppable and not by_text[" near_here"].droppable  # protected
    assert not by_text[" Honolulu"].droppable  # a capitalised word inside a sentence: a name
    assert by_text["The"].droppable  # starts a sentence: not a name
    assert not by_text["\n"].droppable
    assert by_text[" was"].droppable and by_text[","].droppable


def test_a_token_inside_a_character_joins_the_token_that_began_it():
    text = "café au lait"
    offsets = np.array([0, 3, 3, 4, 7])  # "caf", "é" split in two tokens, " au", " lait"
    words = pieces(text, Scored(offsets, np.array([np.nan, -1.0, -3.0, -2.0, -2.0])))
    assert [(text[p.start:p.end], p.tokens) for p in words] == [
        ("café", 3), (" au", 1), (" lait", 1)]


@pytest.mark.parametrize(("text", "drop", "want"), [
    ("He was born in Honolulu", ["He"], "was born in Honolulu"),
    ("He was born in Honolulu", [" was", " born"], "He in Honolulu"),
    ("Marie Skłodowska-Curie won", [" Skłodowska", "-"], "Marie Curie won"),
    ("line one\n  two words here", [" two"], "line one\n  words here"),
    ("one\ntwo three", ["two"], "one\nthree"),
    ("end of it.", [" it"], "end of."),
])
def test_dropped_words_leave_well_formed_text(text, drop, want):
    starts = [text.index(d) for d in drop]
    chosen = [Piece(s, s + len(d), 1, 0.0, True) for s, d in zip(starts, drop)]
    assert cut(text, chosen) == want


@pytest.mark.parametrize("share", [0.9, 0.75, 0.6])
async def test_the_budget_holds_and_protected_spans_survive_byte_for_byte(share):
    count = o200k()
    text = documents(3)
    regions = [(m.start(1), m.end(1)) for m in re.finditer(r"\](.*)", text)]
    limit = int(count(text) * share)
    out = await fine(text, regions, limit, count, FakeScorer())
    assert out is not None and count(out) <= limit
    spans = [text[s:e] for s, e in protected_spans(text)]
    assert [out[s:e] for s, e in protected_spans(out)] == spans  # all, in order, unchanged
    assert out.count("\n") == text.count("\n")
    assert out.startswith("Document [1](Title")  # outside the regions: untouched
    assert [out.count(c) for c in "()[]"] == [text.count(c) for c in "()[]"]
    assert "  " not in out.replace(" \n", "\n")  # no doubled spaces where words went
    if share == 0.9:  # the likely words go first: here, they are enough
        def content(t: str) -> list[str]:
            return [w for w in re.findall(r"\w+", t) if w.lower() not in FILLER]
        assert content(out) == content(text)


async def test_too_little_free_text_is_not_scored():
    scorer = FakeScorer()
    text = "id_1 id_2 id_3 2024-01-01 https://example.org/x 42 3.14 `code` \"quoted\""
    assert await fine(text, [(0, len(text))], 3, o200k(), scorer) is None
    assert scorer.calls == []


async def test_compress_with_the_fine_pass_keeps_pinned_text_and_the_budget():
    question = "Question: what was measured for the glacier?"
    context = documents() + "\n\n" + question
    at = context.index(question)
    count = o200k()
    scorer = FakeScorer()
    coarse = await compress(context, question, 4.0, keyword_embed, count,
                            pinned=[(at, len(context))])
    result = await compress(context, question, 4.0, keyword_embed, count,
                            pinned=[(at, len(context))], score=scorer,
                            options=FineOptions(whole=1))
    assert result.fine == "applied" and scorer.calls
    glacier = next(line for line in context.splitlines() if "(Title: Glacier)" in line)
    assert glacier in result.text.splitlines()  # the most relevant unit: left whole
    assert result.text.endswith("\n\n" + question)  # the question, byte for byte
    assert result.tokens_after == count(result.text) <= result.tokens_before // 4
    assert result.units_kept > coarse.units_kept  # coarse kept more; fine cut inside them
    assert all(question not in t for call in scorer.calls for t in call)  # never scored
    kept = {result.text[s:e] for s, e in protected_spans(result.text)}
    assert kept <= {context[s:e] for s, e in protected_spans(context)}


async def test_a_failed_scoring_call_gives_the_coarse_result():
    coarse = await compress(documents(), "glacier", 4.0, keyword_embed, o200k())
    result = await compress(documents(), "glacier", 4.0, keyword_embed, o200k(),
                            score=failing)
    assert result.fine == "error"
    assert (result.text, result.tokens_after, result.units_kept) == (
        coarse.text, coarse.tokens_after, coarse.units_kept)


async def test_records_have_no_prose_to_thin_so_coarse_alone_cuts_them():
    context, pairs = records()
    scorer = FakeScorer()
    coarse = await compress(context, f'Key: "{pairs[5][0]}"', 4.0, keyword_embed, o200k())
    result = await compress(context, f'Key: "{pairs[5][0]}"', 4.0, keyword_embed, o200k(),
                            score=scorer)
    assert result.fine == "no_room" and scorer.calls == []
    assert result.text == coarse.text
