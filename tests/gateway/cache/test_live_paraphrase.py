"""A live paraphrase through the stack `make run` serves with the semantic layer turned on:
the shipped policy (its error bound and lookup budget), all-MiniLM-L6-v2 loaded by the gateway itself, the shipped
verifier, the memory backend, and an upstream a late hit may cancel (as the local engine
is). The upstream holds its answer until the lookup has ended, so what the paraphrase gets
depends on the cache alone, never on how fast this machine embeds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import FakeServer, GatewayServer
from tests.gateway.cache.test_cache_gateway import ask, chat, stored
from tests.gateway.cache.test_lookup_budget import in_background, until

SHIPPED = Path(__file__).parents[3] / "policies" / "default.toml"


@pytest.fixture
def shipped(make_gateway: Callable[..., GatewayServer],
            fake_server: FakeServer) -> GatewayServer:
    # Without its routing section, whose tiers name models this gateway does not have.
    policy = SHIPPED.read_text().split("\n[routing]")[0]
    assert "\nsemantic = false\n" in policy  # off by default (README: The response cache)
    policy = policy.replace("\nsemantic = false\n", "\nsemantic = true\n")
    gw = make_gateway(f"""
[upstreams.engine]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{fake_server.url}/v1"
cancel_on_late_hit = true

[models."smollm2"]
targets = [{{ upstream = "engine", model = "smollm2" }}]

[cache]
enabled = true
""", policy=policy)
    deadline = time.monotonic() + 120
    while httpx.get(gw.url + "/readyz").json().get("cache") != "semantic":
        assert time.monotonic() < deadline, "the embedding model did not load"
        time.sleep(0.1)
    return gw


def lookups(gw: GatewayServer) -> int:
    assert gw.gateway.cache is not None
    return sum(gw.gateway.cache.stats.lookups.values())


def test_a_cold_cache_sends_a_paraphrase_upstream_and_learns_from_its_answer(
        shipped: GatewayServer, fake: FakeUpstream) -> None:
    """The shipped error bound (delta 0.02) serves no semantic hit before it has learnt
    that it may: the paraphrase goes upstream, and its answer is compared with the stored
    one (the same here: one right outcome)."""
    first = chat(shipped, ask("What is the capital of France?"), model="smollm2")
    assert first.headers["x-cache"] == "miss"
    stored(shipped)
    answer = in_background(lambda: chat(shipped, ask("What's the capital city of France?"),
                                        model="smollm2", headers={"x-fake-hold": "paris"}))
    until(shipped, lambda: lookups(shipped) == 2)  # the lookup has decided
    fake.release("paris")
    second = answer.result(10)
    assert second.headers["x-cache"] == "miss"
    log = shipped.logged(2)[-1]
    assert log["similarity"] is not None and log["similarity"] > 0.9, log
    stored(shipped)  # the store and the comparison
    cache = shipped.gateway.cache
    assert cache is not None and cache.bound is not None
    assert cache.bound.stats.learnt == {True: 1}
    assert len(fake.records) == 2
