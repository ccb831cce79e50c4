"""The net-positive gate: compress only when the prefill time saved beats the compressor's."""

from __future__ import annotations

import pytest

from gateway.compression.gate import CompressorRate, PrefillRate, decide


def test_compresses_when_the_saving_beats_the_compressors_time():
    # 4,000 tokens at 4x: 3,000 saved x 1 ms = 3,000 ms against 60 ms/1k x 4 = 240 ms.
    d = decide(4000, 4.0, 1.0, 60.0)
    assert d.compress and d.skip is None
    assert (d.saved_tokens, d.saved_ms, d.cost_ms) == (3000, 3000.0, 240.0)


def test_skips_when_the_prefill_is_fast():
    # A hosted GPU model at 0.02 ms/token: 60 ms saved against 240 ms of compressor time.
    d = decide(4000, 4.0, 0.02, 60.0)
    assert not d.compress and d.skip == "not_worth_it"


def test_the_margin_and_the_cost_weight():
    assert not decide(4000, 4.0, 0.1, 60.0, margin_ms=100).compress  # 300 < 240 + 100
    assert decide(4000, 4.0, 0.1, 60.0).compress  # 300 > 240
    # Tokens worth 100 ms per 1k to the operator: 3 x 100 = 300 ms > 240 ms.
    assert decide(4000, 4.0, None, 60.0, cost_weight=100).compress
    assert decide(4000, 4.0, None, 60.0).skip == "no_prefill_rate"
    assert decide(4000, 1.0, 5.0, 60.0).skip == "not_worth_it"  # nothing to save


def test_the_prefill_rate_is_the_slope_not_the_mean():
    rate = PrefillRate(min_samples=4)
    for tokens in (1000, 2000, 3000, 4000):
        rate.observe(tokens, 200 + 0.5 * tokens)  # 200 ms of network and queueing
    assert rate.ms_per_token == pytest.approx(0.5)


def test_a_noisy_fit_claims_no_saving():
    rate = PrefillRate(min_samples=4)
    for tokens, ttft in ((1000, 400.0), (1100, 250.0), (1200, 420.0), (1300, 260.0),
                         (1400, 430.0), (1500, 270.0)):  # network jitter, prefill invisible
        rate.observe(tokens, ttft)
    assert rate.ms_per_token == 0.0


def test_the_prefill_rate_is_unknown_until_lengths_vary():
    rate = PrefillRate(min_samples=4)
    for _ in range(10):
        rate.observe(1000, 700.0)
    assert rate.ms_per_token is None
    rate.observe(-1, 5.0)
    rate.observe(10, float("nan"))
    assert rate.ms_per_token is None
    few = PrefillRate(min_samples=8)
    few.observe(100, 1.0)
    few.observe(5000, 100.0)
    assert few.ms_per_token is None


def test_the_compressor_rate_follows_its_measurements():
    rate = CompressorRate(60.0, alpha=0.5)
    rate.observe(2000, 40.0)  # 20 ms per 1k
    assert rate.ms_per_1k == pytest.approx(40.0)
    rate.observe(10, 1000.0)  # too small to tell
    assert rate.ms_per_1k == pytest.approx(40.0)
