"""Hedged requests: the race itself (primary, hedge after a delay, the loser cancelled, the
budget), and a gateway whose model's first target is slow answering from the second, the
slow call cancelled upstream, whole and streamed. And the client's time-to-first-token
objective (``x-gateway-ttft-slo-ms``) checked at the door."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import openai
import pytest

from gateway.hedge import race
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, FakeServer, GatewayServer


class Call:
    """A call that answers ``value`` once ``release()``-d (or at once)."""

    def __init__(self, value: Any, at_once: bool = False) -> None:
        self.value = value
        self.gate = asyncio.Event()
        if at_once:
            self.gate.set()
        self.started = self.cancelled = False

    async def __call__(self) -> Any:
        self.started = True
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


def run_race(primary: Call, hedge: Call, allowed: bool = True,
             release: Callable[[], None] | None = None) -> tuple[Any, bool, list[Any]]:
    discarded: list[Any] = []

    async def go() -> tuple[Any, bool]:
        task = asyncio.ensure_future(race(primary, hedge, 0.01, lambda: allowed,
                                          lambda r: r == "bad", discarded.append))
        await asyncio.sleep(0.05)  # past the hedge delay: the hedge (if allowed) is out
        if release is not None:
            release()
        return await task
    result, hedged = asyncio.run(go())
    return result, hedged, discarded


def test_a_quick_primary_sends_no_hedge() -> None:
    assert run_race(Call("a", at_once=True), Call("b"))[:2] == ("a", False)


def test_a_slow_primary_loses_to_the_hedge_and_is_cancelled() -> None:
    primary, hedge = Call("a"), Call("b")
    assert run_race(primary, hedge, release=hedge.gate.set)[:2] == ("b", True)
    assert primary.cancelled


def test_a_failed_hedge_waits_for_the_primary() -> None:
    primary, hedge = Call("a"), Call("bad", at_once=True)
    result, hedged, discarded = run_race(primary, hedge, release=primary.gate.set)
    assert (result, hedged) == ("a", True) and not primary.cancelled
    assert discarded == ["bad"]  # the failed hedge's answer, closed


def test_both_failing_returns_the_primarys_and_an_error_only_when_nothing_answered() -> None:
    primary, hedge = Call("bad"), Call("bad", at_once=True)
    result, _, discarded = run_race(primary, hedge, release=primary.gate.set)
    assert result == "bad" and discarded == ["bad"]
    boom = Call(RuntimeError("down"))
    with pytest.raises(RuntimeError):
        run_race(boom, Call(RuntimeError("down too"), at_once=True), release=boom.gate.set)


def test_no_budget_no_hedge() -> None:
    primary, hedge = Call("a"), Call("b")
    assert run_race(primary, hedge, allowed=False, release=primary.gate.set)[:2] == (
        "a", False)
    assert not hedge.started


SLOW_THEN_FAST = """
[upstreams.slow]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r1/v1"
headers = {{ "x-fake-ttft-ms" = "5000" }}

[upstreams.fast]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r2/v1"

[models.hedged]
targets = [{{ upstream = "slow", model = "m" }}, {{ upstream = "fast", model = "m" }}]
"""
HEDGE = DEFAULT_POLICY + '\n[balance]\nhedge_after_ms = { "hedged" = 30 }\nhedge_budget = 1.0\n'


@pytest.mark.parametrize("stream", [False, True])
def test_a_slow_target_is_hedged_on_the_next_and_cancelled(
        make_gateway: Callable[..., GatewayServer], fake_server: FakeServer,
        fake: FakeUpstream, stream: bool) -> None:
    gw = make_gateway(SLOW_THEN_FAST.format(url=fake_server.url), policy=HEDGE)
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        answer = client.chat.completions.create(
            model="hedged", stream=stream, messages=[{"role": "user", "content": "hi"}])
        text = ("".join(c.choices[0].delta.content or "" for c in answer if c.choices)
                if stream else answer.choices[0].message.content)  # type: ignore[union-attr]
    assert text == "w0 w1 w2 w3 w4 w5 w6 w7"
    [log] = gw.logged(1)
    assert (log["hedged"], log["upstream"], log["status"]) == (True, "fast", 200)
    assert log["total_ms"] < 2000  # not the slow target's 5 s
    # the slow call was cancelled upstream the moment the hedge won
    slow = fake.wait_for(lambda recs: next((r for r in recs if r.path.startswith("/r1/")
                                            and r.disconnected is not None), None))
    assert slow.first_byte is None


def test_a_bad_slo_header_is_a_400(gw: GatewayServer, fake: FakeUpstream) -> None:
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client, \
            pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="fake-model", messages=[
            {"role": "user", "content": "hi"}], extra_headers={"x-gateway-ttft-slo-ms": "soon"})
    assert err.value.param == "x-gateway-ttft-slo-ms" and fake.records == []


BOTH_SLOW = """
[upstreams.slow1]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r1/v1"
headers = {{ "x-fake-ttft-ms" = "60" }}

[upstreams.slow2]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r2/v1"
headers = {{ "x-fake-ttft-ms" = "60" }}

[upstreams.quick1]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r3/v1"

[upstreams.quick2]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/r4/v1"

[models.overloaded]
targets = [{{ upstream = "slow1", model = "m" }}, {{ upstream = "slow2", model = "m" }}]

[models.quick]
targets = [{{ upstream = "quick1", model = "m" }}, {{ upstream = "quick2", model = "m" }}]
"""
LATE = DEFAULT_POLICY + ('\n[balance]\nhedge_after_ms = { "overloaded" = 20, "quick" = 5000 }'
                         '\nhedge_budget = 1.0\n')


def test_no_hedges_while_most_requests_are_late(
        make_gateway: Callable[..., GatewayServer], fake_server: FakeServer) -> None:
    """Every answer late (overload): hedged while the late share (EWMA, weight 0.1) is
    under half, i.e. seven times, then not; two answers in time bring it under again."""
    gw = make_gateway(BOTH_SLOW.format(url=fake_server.url), policy=LATE)
    models = ("overloaded",) * 8 + ("quick", "quick", "overloaded")
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        for model in models:
            client.chat.completions.create(model=model, messages=[
                {"role": "user", "content": "hi"}])
    assert [log["hedged"] for log in gw.logged(len(models))] == \
        [True] * 7 + [False, False, False, True]
