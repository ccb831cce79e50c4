"""The error bound through the gateway (openai SDK as the client): a cold cache serves no
paraphrase; each one that goes upstream is compared with its candidate's answer; once enough
agree, paraphrases are served; answers that disagree never open the bound; a pair the
contract refuses is never a candidate."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer
from tests.gateway.cache.test_cache_gateway import MEMORY, ask, bag_of_words, chat, stored

POLICY = DEFAULT_POLICY + """
[cache]
enabled = true
semantic = true
max_error_rate = 0.2
explore_share = 0
operating_point = { similarity = 0.5, verifier = 0.0 }
lookup_budget_ms = 60000
"""
QUESTION = "what is the best way to learn to cook italian food at home"
#: One more word each: paraphrases at about the same cosine (bag-of-words embeddings).
EXTRA = ["please", "quickly", "today", "cheaply", "easily", "properly", "well", "really",
         "truly", "simply", "fully", "safely", "alone", "slowly", "gently", "calmly",
         "happily", "rightly", "wisely", "boldly", "freely", "lately", "mostly", "nicely"]


def metric(gw: GatewayServer, name: str, label: str) -> float:
    text = httpx.get(gw.url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith(f"{name}{{") and label in x)
    return float(line.rsplit(" ", 1)[1])


def test_paraphrases_are_served_once_enough_answers_agree(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(MEMORY, policy=POLICY, embed=bag_of_words)
    chat(gw, ask(QUESTION))
    stored(gw)
    results = []
    for word in EXTRA:
        results.append(chat(gw, ask(f"{QUESTION} {word}")).headers["x-cache"])
        stored(gw)  # the store and the comparison, in the background, are done
    assert results[0] == "miss"  # cold: no outcome yet, nothing served
    # 3 / delta = 15 pairs in the quadrant first (the prior's QQP pairs count among them)
    assert "hit" not in results[:8], " ".join(results)
    assert results[15:].count("hit") >= len(EXTRA[15:]) // 3, " ".join(results)
    misses = results.count("miss")
    assert metric(gw, "gateway_cache_bound_outcomes_total", 'outcome="right"') == misses
    assert metric(gw, "gateway_cache_bound_outcomes_total", 'outcome="wrong"') == 0
    assert metric(gw, "gateway_cache_bound_decisions_total", 'decision="serve"') == \
        results.count("hit")
    assert len(fake.records) == 1 + misses


def test_answers_that_disagree_never_open_the_bound(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(MEMORY, policy=POLICY, embed=bag_of_words)
    for i, word in enumerate(["", *EXTRA]):
        # each answer another length: "w0 w1 w2" against "w0 w1 w2 w3": they disagree
        r = chat(gw, ask(f"{QUESTION} {word}".strip()),
                 headers={"x-fake-tokens": str(3 + i % 7)})
        assert r.headers["x-cache"] == "miss"
        stored(gw)
    assert metric(gw, "gateway_cache_bound_outcomes_total", 'outcome="wrong"') >= 20
    assert metric(gw, "gateway_cache_bound_decisions_total", 'decision="serve"') == 0


def test_a_question_the_contract_refuses_is_never_a_candidate(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(MEMORY, policy=POLICY.replace("max_error_rate = 0.2",
                                                    "max_error_rate = 0"),
                      embed=bag_of_words)  # the static point serves any neighbour
    chat(gw, ask("how do I convert celsius to fahrenheit"))
    stored(gw)
    assert chat(gw, ask("how do I convert celsius to fahrenheit please")
                ).headers["x-cache"] == "hit"
    for other in ("how do I convert fahrenheit to celsius",
                  "how do I not convert celsius to fahrenheit",
                  "how do I convert 30 celsius to fahrenheit"):
        assert chat(gw, ask(other)).headers["x-cache"] == "miss"
