"""The error bound: a cold cache serves no semantic hit; learnt outcomes open a threshold only
as far as the wrong rate stays within delta; an entry once wrong is not served again as
close; exploration keeps a share of would-be hits checked."""

from __future__ import annotations

import random

from gateway.cache.bound import ErrorBound, Prior, calibrate


def bound(delta: float = 0.05, explore: float = 0.0, prior: Prior | None = None,
          seed: int = 0) -> ErrorBound:
    return ErrorBound(delta, explore, prior or Prior.empty(), rng=random.Random(seed).random)


def test_a_cold_cache_serves_nothing_until_outcomes_are_learnt() -> None:
    b = bound()  # delta 0.05: a quadrant is tested from 3 / delta = 60 pairs
    assert b.decide("m", "e", 0.99, 0.999) == "miss"
    for i in range(80):
        b.learn("m", f"e{i}", 0.98, 0.5, right=True)
    assert b.decide("m", "new", 0.985, 0.5) == "serve"
    assert b.decide("m", "new", 0.9, 0.5) == "miss"  # nothing learnt that low
    assert b.decide("other-model", "new", 0.985, 0.5) == "miss"  # groups learn apart


def test_wrong_outcomes_keep_the_threshold_where_the_rate_is_within_delta() -> None:
    b = bound(delta=0.05)
    rng = random.Random(1)
    for i in range(3000):  # wrong 30% below cosine 0.95, 1% above
        cos = rng.uniform(0.85, 1.0)
        b.learn("m", f"e{i}", cos, 0.5, right=rng.random() >= (0.3 if cos < 0.95 else 0.01))
    assert b.decide("m", "x", 0.99, 0.5) == "serve"
    assert b.decide("m", "x", 0.96, 0.5) == "serve"
    assert b.decide("m", "x", 0.93, 0.5) == "miss"


def test_an_entry_once_wrong_is_not_served_for_a_question_as_far() -> None:
    b = bound()
    for i in range(300):
        b.learn("m", f"e{i}", 0.98, 0.5, right=True)
    b.learn("m", "bad", 0.99, 0.6, right=False)
    assert b.decide("m", "bad", 0.985, 0.5) == "miss"
    assert b.decide("m", "bad", 0.995, 0.7) == "serve"  # closer than it was wrong at
    assert b.decide("m", "good", 0.985, 0.5) == "serve"


def test_exploration_sends_a_share_of_would_be_hits_upstream() -> None:
    b = bound(explore=0.25, seed=3)
    for i in range(80):
        b.learn("m", f"e{i}", 0.98, 0.5, right=True)
    decisions = [b.decide("m", "e", 0.99, 0.5) for _ in range(400)]
    assert set(decisions) == {"serve", "explore"}
    assert 60 <= decisions.count("explore") <= 140
    assert b.stats.decisions["explore"] == decisions.count("explore")


def test_a_new_delta_moves_the_thresholds_at_once() -> None:
    b = bound(delta=0.1)
    for i in range(200):
        b.learn("m", f"e{i}", 0.97, 0.5, right=i % 20 != 0)  # 5% wrong
    assert b.decide("m", "x", 0.975, 0.5) == "serve"
    b.configure(0.02, 0.0)
    assert b.decide("m", "x", 0.975, 0.5) == "miss"


def test_the_verifier_score_alone_can_open_a_threshold() -> None:
    b = bound()
    for i in range(80):
        b.learn("m", f"e{i}", 0.7, 0.9999, right=True)
        b.learn("m", f"f{i}", 0.7, 0.6, right=i % 3 == 0)
    assert b.decide("m", "x", 0.7, 0.99995) == "serve"
    assert b.decide("m", "x", 0.7, 0.5) == "miss"


def test_a_prior_opens_thresholds_before_any_outcome_and_yields_to_them() -> None:
    prior = calibrate([0.99] * 200, [0.5] * 200, [False] * 200, weight=100)  # 100 right
    b = bound(prior=prior)
    assert b.decide("m", "x", 0.995, 0.5) == "serve"
    for i in range(100):
        b.learn("m", f"e{i}", 0.995, 0.5, right=False)
    assert b.decide("m", "x", 0.995, 0.5) == "miss"
    assert b.decide("fresh", "x", 0.995, 0.5) == "serve"  # another group: the prior alone
    assert prior.cosine_only().total[:, 1:].sum() == 0
    assert prior.cosine_only().total.sum() == prior.total.sum()


def test_the_shipped_prior_loads_and_serves_nothing_cold_at_the_default_delta() -> None:
    b = ErrorBound(0.02, 0.05)
    assert b.prior.total.sum() > 0
    assert b.decide("m", "x", 0.999, 0.99999) == "miss"


def test_a_namespaces_outcomes_move_its_own_bound_only() -> None:
    b = bound()
    for i in range(80):
        b.learn("m", f"a{i}", 0.98, 0.5, right=True, namespace="team-a")
    assert b.decide("m", "x", 0.985, 0.5, namespace="team-a") == "serve"
    assert b.decide("m", "x", 0.985, 0.5, namespace="team-b") == "miss"  # B: still cold
    assert b.decide("m", "x", 0.985, 0.5, namespace="team-a/sub") == "miss"
    for i in range(500):  # B's answers all wrong where A's were right
        b.learn("m", f"b{i}", 0.98, 0.5, right=False, namespace="team-b")
    assert b.decide("m", "x", 0.985, 0.5, namespace="team-a") == "serve"
    for i in range(80):  # and B's right answers open nothing for A's other namespace
        b.learn("m", f"c{i}", 0.95, 0.5, right=True, namespace="team-b/x")
    assert b.decide("m", "x", 0.955, 0.5, namespace="team-a") == "miss"


def test_namespaces_without_end_forget_their_own_key_s_bounds() -> None:
    b = ErrorBound(0.05, 0.0, Prior.empty(), max_groups=4, max_entries=10)
    for i in range(80):
        b.learn("m", f"a{i}", 0.98, 0.5, right=True, namespace="team-a")
    b.learn("m", "a-bad", 0.99, 0.9, right=False, namespace="team-a")
    for n in range(50):  # B makes namespace after namespace, wrong each time
        b.learn("m", f"b{n}", 0.98, 0.5, right=False, namespace=f"team-b/{n}")
    assert b.decide("m", "x", 0.985, 0.5, namespace="team-a") == "serve"  # A's bound kept
    assert b.decide("m", "a-bad", 0.985, 0.5, namespace="team-a") == "miss"  # and its entry
