"""Relevance: BM25, exact matches of the question's protected spans, the dense score."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.compression.rank import Weights, exact, lexical, relevance

TEXTS = ["The cat sat on the mat.", "Wilhelm Röntgen won the first Nobel Prize in Physics.",
         "", "Order 2a8d601d-1d69 shipped on 1901-05-02."]


def test_bm25_scores_the_question_against_the_units_best_is_one():
    scores = lexical(TEXTS, "who won the first nobel prize in physics")
    assert scores.argmax() == 1 and scores.max() == 1.0 and scores[0] == scores[2] == 0


@pytest.mark.parametrize("question", ["the of and", "zebra quartz", ""])
def test_no_shared_term_scores_zero(question):
    assert lexical(TEXTS, question).tolist() == [0.0] * len(TEXTS)


@pytest.mark.parametrize(("question", "expected"), [
    ('Key: "2a8d601d-1d69"', [0, 0, 0, 1]),
    ("what happened in 1901-05-02 to order 2a8d601d-1d69", [0, 0, 0, 1]),
    ("what shipped in 1901-05-02 or 1999", [0, 0, 0, 0.5]),
    ("no spans here", [0, 0, 0, 0]),
])
def test_exact_is_the_share_of_the_questions_protected_spans_found(question, expected):
    assert exact(TEXTS, question).tolist() == expected


async def test_the_embedding_is_one_batched_call_over_each_units_start():
    calls: list[list[str]] = []

    async def embed(texts: list[str]) -> np.ndarray:
        calls.append(texts)
        vectors = np.array([[1.0, 0.0]] + [[0.0, 1.0]] * (len(texts) - 1), np.float32)
        vectors[2] = [1.0, 0.0]  # the second unit points where the question does
        return vectors

    scores = await relevance(["aaaa", "bbbb", "cccc"], "q", embed,
                             Weights(dense=1.0, lexical=0.0, exact=0.0, embed_chars=2))
    assert calls == [["q", "aa", "bb", "cc"]]
    assert scores.tolist() == [0.0, 1.0, 0.0]


async def test_without_an_embedder_the_ranking_is_lexical():
    scores = await relevance(TEXTS, "nobel prize physics", None)
    assert scores.argmax() == 1


async def test_a_unit_made_of_ids_is_not_embedded_and_scores_the_mean_cosine():
    calls: list[list[str]] = []

    async def embed(texts: list[str]) -> np.ndarray:
        calls.append(texts)
        return np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], np.float32)

    texts = ["a sentence about cats", '"2a8d601d-1d69": "9f4a92b9-5f69"', "dogs and birds"]
    scores = await relevance(texts, "q", embed, Weights(dense=1.0, lexical=0.0, exact=0.0))
    assert calls == [["q", "a sentence about cats", "dogs and birds"]]
    assert scores.tolist() == pytest.approx([0.6, 0.3, 0.0])
