"""``compress``: the budget holds, the question and pinned text stay, spans stay whole."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gateway.compression import compress
from gateway.compression.tokens import estimate, o200k
from gateway.compression.units import protected_spans

TOPICS = ["volcano", "violin", "glacier", "satellite", "penguin", "chess", "tide", "copper",
          "orchid", "comet"]


async def keyword_embed(texts: list[str]) -> np.ndarray:
    """A fake MiniLM: one dimension per topic word, plus one so no vector is zero."""
    vectors = np.array([[t.lower().count(w) for w in TOPICS] + [0.1] for t in texts],
                       np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def documents(n: int = 10) -> str:
    return "\n".join(
        f"Document [{i + 1}](Title: {w.title()}) The {w} was measured at {100 + i}.5 units "
        f"on 2024-0{i % 9 + 1}-1{i % 9}; see https://example.org/{w}?id={i} and `{w}_id`. "
        + f"More about the {w} follows here. " * 3
        for i, w in enumerate(TOPICS[:n]))


def records(n: int = 40) -> tuple[str, list[tuple[str, str]]]:
    pairs = [(f"{i:08x}-aaaa-4bbb-8ccc-{i * 7919:012x}",
              f"{i * 31:08x}-dddd-4eee-8fff-{i * 104729:012x}") for i in range(n)]
    last = len(pairs) - 1
    text = "".join(("{" if i == 0 else " ") + f'"{k}": "{v}"' + (",\n" if i != last else "}")
                   for i, (k, v) in enumerate(pairs))
    return text, pairs


COUNTERS = {"o200k": o200k(), "bytes/4": estimate}


@pytest.mark.parametrize("counter", COUNTERS)
@pytest.mark.parametrize("ratio", [1.5, 2.0, 3.0, 4.0, 8.0])
async def test_the_budget_holds_in_tokens_of_the_text_returned(counter, ratio):
    count = COUNTERS[counter]
    context = documents()
    result = await compress(context, "tell me about the glacier", ratio, keyword_embed, count)
    assert result.tokens_before == count(context)
    assert result.tokens_after == count(result.text) <= result.tokens_before // ratio
    assert result.ratio >= ratio
    assert result.units_kept + result.units_dropped == 10 and result.ms > 0


@pytest.mark.parametrize("question", ["tell me about the glacier", "what about chess and tide"])
async def test_protected_spans_are_kept_byte_for_byte_or_dropped_with_their_unit(question):
    context = documents()
    result = await compress(context, question, 3.0, keyword_embed, o200k())
    kept = {result.text[s:e] for s, e in protected_spans(result.text)}
    assert kept and kept <= {context[s:e] for s, e in protected_spans(context)}
    for line in result.text.splitlines():
        assert line in context.splitlines()


async def test_the_question_is_only_read_and_pinned_text_stays_in_place():
    question = "Question: what was measured for the glacier?"
    context = documents() + "\n\n" + question
    at = context.index(question)
    result = await compress(context, question, 4.0, keyword_embed, o200k(),
                            pinned=[(at, len(context))])
    assert result.text.endswith("\n\n" + question)
    assert question == "Question: what was measured for the glacier?"
    assert "(Title: Glacier)" in result.text


async def test_the_most_relevant_documents_sit_at_the_start_and_the_end():
    # "glacier" most, then "comet" (fewer mentions), both far from the ends of the context
    question = "glacier glacier glacier comet"
    result = await compress(documents(), question, 2.0, keyword_embed, o200k())
    titles = [line.split("Title: ")[1].split(")")[0] for line in result.text.splitlines()]
    assert titles[0] == "Glacier" and titles[-1] == "Comet"
    kept_in_order = await compress(documents(), question, 2.0, keyword_embed, o200k(),
                                   reorder=False)
    order = [line.split("Title: ")[1].split(")")[0]
             for line in kept_in_order.text.splitlines()]
    assert order == [t.title() for t in TOPICS if t.title() in order]
    assert sorted(order) == sorted(titles)


@pytest.mark.parametrize("ratio", [2.0, 4.0])
@pytest.mark.parametrize("asked", [0, 17, 39])
async def test_kv_records_are_kept_whole_and_the_asked_one_survives(ratio, asked):
    context, pairs = records()
    key, value = pairs[asked]
    result = await compress(context, f'Key: "{key}"', ratio, keyword_embed, o200k())
    kept = json.loads(result.text)
    assert kept[key] == value
    assert all(dict(pairs)[k] == v for k, v in kept.items())
    assert 1 < len(kept) <= len(pairs) // ratio


@pytest.mark.parametrize(("context", "ratio"), [
    ("One short paragraph that is the only unit.", 4.0),
    ("```\none code block\n\nkept whole\n```\n", 4.0),
    (documents(), 1.0),
    (documents(), 0.5),
    ("", 4.0),
])
async def test_nothing_to_gain_leaves_the_context_as_it_was(context, ratio):
    result = await compress(context, "glacier", ratio, keyword_embed, estimate)
    assert result.text == context and result.ratio == 1.0 and result.units_dropped == 0


async def test_when_no_unit_fits_the_most_relevant_one_stays_over_the_budget():
    context = documents(4)
    result = await compress(context, "glacier", 4.0, keyword_embed, o200k(),
                            pinned=[(0, len(context) // 2)])
    assert result.text.startswith(context[:len(context) // 2])
    assert result.units_kept == 1 and "(Title: Glacier)" in result.text


async def test_a_bad_ratio_is_refused():
    with pytest.raises(ValueError, match="target_ratio"):
        await compress(documents(), "glacier", 0.0, keyword_embed, estimate)
