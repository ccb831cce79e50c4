"""Prompt-cache affinity ([balance] models = { NAME = "affinity" }): a conversation's turns
go to the deployment that took its first turn, new conversations take the deployments in
turn, and a conversation whose deployment fails follows the one that answered."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from gateway.affinity import conversation_key
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer

MODELS = """
[models.deployments]
targets = [{ upstream = "fake", model = "dep-a" }, { upstream = "backup", model = "dep-b" }]

[models.flaky]
targets = [{ upstream = "dead", model = "dep-a" }, { upstream = "backup", model = "dep-b" }]
"""
POLICY = DEFAULT_POLICY + """
[balance]
models = { "deployments" = "affinity", "flaky" = "affinity" }
affinity_ttl_s = 600
"""


def _turns(gw: GatewayServer, model: str, conversation: str, n: int,
           key: str | None = None) -> None:
    messages = [{"role": "system", "content": f"You help {conversation}."}]
    for turn in range(n):
        messages.append({"role": "user", "content": f"turn {turn}"})
        body = {"model": model, "messages": messages}
        if key is not None:
            body["prompt_cache_key"] = key
        r = httpx.post(gw.v1 + "/chat/completions", json=body)
        assert r.status_code == 200
        messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]
                         ["content"]})


def _served(fake: FakeUpstream) -> list[str]:
    return [r.json["model"] for r in fake.records if r.path.endswith("/chat/completions")]


def test_each_conversation_stays_on_one_deployment_and_they_are_spread(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(MODELS, policy=POLICY)
    for c in ("alice", "bob", "carol", "dave"):
        fake.clear()
        _turns(gw, "deployments", c, 3)
        served = _served(fake)
        assert len(served) == 3 and len(set(served)) == 1, (c, served)
        assert served[0] == ("dep-a" if c in ("alice", "carol") else "dep-b")


def test_a_prompt_cache_key_names_the_conversation(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(MODELS, policy=POLICY)
    _turns(gw, "deployments", "erin", 1, key="session-1")
    _turns(gw, "deployments", "someone else entirely", 1, key="session-1")
    served = _served(fake)
    assert len(served) == 2 and served[0] == served[1]
    assert conversation_key("m", {"prompt_cache_key": "k", "messages": []}) == \
        conversation_key("m", {"prompt_cache_key": "k", "messages": [{"role": "user"}]})


def test_a_conversation_follows_the_deployment_that_answered_after_a_failure(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(MODELS, policy=POLICY)
    _turns(gw, "flaky", "frank", 1)  # first in turn: "dead" (refused), then backup answers
    _turns(gw, "flaky", "grace", 1)  # second in turn: backup
    fake.clear()
    _turns(gw, "flaky", "frank", 3)
    assert _served(fake) == ["dep-b"] * 3
    logged = gw.logged(5)
    assert logged[0]["retries"] > 0  # frank's first turn: refused by "dead", then backup
    assert [r["retries"] for r in logged[2:]] == [0, 0, 0]  # now straight to backup
