"""Latency-aware choice among equivalent targets (PeakEWMA, power of two choices): the
estimate's peaks and decay, the choice, and a gateway sending a balanced model's requests to
its fast replicas rather than its slow one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import openai

from gateway.balance import PeakEwma, choose
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, FakeServer, GatewayServer


def test_the_estimate_jumps_to_a_peak_and_decays_towards_faster_samples() -> None:
    now = [0.0]
    ewma = PeakEwma(clock=lambda: now[0])
    ewma.observe(100.0, decay_s=10)
    assert ewma.estimate_ms == 100.0
    now[0] = 10.0  # one time constant later, a fast sample moves it (1 - 1/e) of the way
    ewma.observe(10.0, decay_s=10)
    assert 42 < ewma.estimate_ms < 44
    ewma.observe(500.0, decay_s=10)  # a slower one counts at once
    assert ewma.estimate_ms == 500.0
    ewma.pending = 3
    assert ewma.cost(decay_s=10) == 2000.0
    now[0] = 30.0  # unsampled for a while: it looks cheaper again, to be tried
    assert ewma.cost(decay_s=10) < 2000.0 * 0.14


def test_the_cheaper_of_two_goes_first_the_rest_follow_in_order() -> None:
    cost = {"a": 5.0, "b": 1.0, "c": 3.0}
    draws = iter([0, 1])  # a, then c (the second draw skips the first)
    assert choose(["a", "b", "c"], cost.__getitem__, lambda lo, hi: next(draws)) == [
        "c", "a", "b"]
    assert choose(["only"], cost.__getitem__) == ["only"]


REPLICAS = """
[upstreams.fast1]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r1/v1"

[upstreams.fast2]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r2/v1"

[upstreams.slow]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r3/v1"
headers = {{ "x-fake-ttft-ms" = "40" }}

[models.replicas]
targets = [{{ upstream = "slow", model = "m" }}, {{ upstream = "fast1", model = "m" }},
           {{ upstream = "fast2", model = "m" }}]
"""


def served(fake: FakeUpstream) -> Counter[str]:
    return Counter(r.path.split("/")[1] for r in fake.records)


def test_a_balanced_model_goes_to_its_fast_replicas(
        make_gateway: Callable[..., GatewayServer], fake_server: FakeServer,
        fake: FakeUpstream) -> None:
    balanced = DEFAULT_POLICY + '\n[balance]\nmodels = { "replicas" = "peak_ewma" }\n'
    for policy, most in ((DEFAULT_POLICY, "r3"), (balanced, None)):
        gw = make_gateway(REPLICAS.format(url=fake_server.url), policy=policy)
        fake.clear()
        with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
            for _ in range(60):
                client.chat.completions.create(model="replicas", messages=[
                    {"role": "user", "content": "hi"}])
        counts = served(fake)
        if most is not None:  # ordered: the first target takes everything
            assert counts == {most: 60}
        else:  # the slow one only until its first answer says it is slow
            assert counts["r3"] <= 2 and counts["r1"] + counts["r2"] >= 58
            assert counts["r1"] > 10 and counts["r2"] > 10  # and the fast ones share
