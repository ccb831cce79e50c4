"""The shipped verifier on real all-MiniLM-L6-v2 embeddings: it must reject the pairs a
cosine threshold confuses (other subject, other number, negation) and accept paraphrases."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.cache.mlp_verifier import MlpVerifier, lexical_features, pair_features
from local_engine.embedder import Embedder


@pytest.fixture(scope="module")
def embed() -> Embedder:
    return Embedder.load()


@pytest.fixture(scope="module")
def verifier() -> MlpVerifier:
    return MlpVerifier()


def score(verifier: MlpVerifier, embed: Embedder, a: str, b: str) -> tuple[float, float]:
    u, v = embed([a, b])
    return float(u @ v), verifier.score(a, b, u, v)


@pytest.mark.parametrize(("a", "b"), [
    ("How do I learn Python quickly?", "What is the fastest way to learn Python?"),
    ("What is the capital of France?", "What's the capital city of France?"),
    ("How can I lose weight fast?", "What are the quickest ways to lose weight?"),
    ("How do I bake bread?", "How can I bake bread at home?"),
])
def test_paraphrases_pass(verifier: MlpVerifier, embed: Embedder, a: str, b: str) -> None:
    cos, s = score(verifier, embed, a, b)
    assert s >= 0.75, (cos, s)


@pytest.mark.parametrize(("a", "b"), [
    ("How do I learn Python quickly?", "How do I learn Java quickly?"),
    ("What is 15% of 200?", "What is 25% of 200?"),
    ("Is coffee good for your health?", "Is coffee not good for your health?"),
    ("What is the capital of France?", "What is the capital of Germany?"),
])
def test_look_alikes_fail(verifier: MlpVerifier, embed: Embedder, a: str, b: str) -> None:
    cos, s = score(verifier, embed, a, b)
    assert cos > 0.5  # a cosine threshold would be tempted...
    assert s < 0.5, (cos, s)  # ...the verifier is not


def test_decisions_are_deterministic(verifier: MlpVerifier, embed: Embedder) -> None:
    u, v = embed(["How do I bake bread?", "How can I bake bread at home?"])
    x = pair_features("How do I bake bread?", "How can I bake bread at home?", u, v)
    assert x.dtype == np.float32
    assert x.shape == (3 * len(u) + 1 + len(lexical_features("a", "b")),)
    assert verifier.score_features(x[None, :])[0] == verifier.score_features(x[None, :])[0]
    assert MlpVerifier().score("How do I bake bread?", "How can I bake bread at home?", u, v) \
        == verifier.score("How do I bake bread?", "How can I bake bread at home?", u, v)


def test_text_features_see_mismatches() -> None:
    same = lexical_features("What is 5 + 5?", "What is 5 + 5?")
    nums = lexical_features("What is 5 + 5?", "What is 6 + 5?")
    neg = lexical_features("Is it safe?", "Is it not safe?")
    names = lexical_features("Who is the CEO of Apple?", "Who is the CEO of Google?")
    assert same[5] == 0 and nums[5] == 1  # numbers differ
    assert neg[8] == 1 and same[8] == 0  # negation differs
    assert names[7] > 0  # capitalised names differ
