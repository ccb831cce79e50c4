"""The lookup budget: a semantic lookup never slows a miss, and a hit found late is served
only when cancelling the upstream call costs nothing.

The vector search is held shut by the test (an asyncio.Event on the gateway's loop, opened
from here) and the fake upstream holds its answer until released (``x-fake-hold``), so
every ordering below is the test's doing, never the machine's speed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from gateway.cache.backend import Entry, MemoryBackend
from gateway.config import UpstreamConfig
from gateway.state import build_upstream
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, FakeServer, GatewayServer
from tests.gateway.cache.test_cache_gateway import ask, bag_of_words, chat, client, stored
from tests.gateway.routing.test_routing import (
    HARD,
    MODELS,
    constant_embed,
    routing_policy,
    tiny_artifact,
)

POLICY = DEFAULT_POLICY + """
[cache]
enabled = true
semantic = true
# a static operating point (no error bound): these tests are about the lookup's machinery
max_error_rate = 0
operating_point = { similarity = 0.8, verifier = 0.0 }
lookup_timeout_ms = 60000
lookup_budget_ms = 1
"""
QUESTION = "what is the capital city of france"
PARAPHRASE = "what is the capital city of france please"
ANSWER = "w0 w1 w2 w3 w4 w5 w6 w7"  # the fake upstream's answer to everything


class HeldSearch(MemoryBackend):
    """The memory backend whose vector search waits, while shut, until the test opens it
    (then answers, or raises ``fail``)."""

    def __init__(self) -> None:
        super().__init__()
        self.searches = 0
        self.entered = threading.Event()
        self.fail: Exception | None = None
        self._shut = False
        self._open: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def shut(self) -> None:
        self._shut, self._open = True, None
        self.entered.clear()

    def open(self, fail: Exception | None = None) -> None:
        assert self.entered.wait(5), "no search came"
        assert self._loop is not None and self._open is not None
        self.fail, self._shut = fail, False
        self._loop.call_soon_threadsafe(self._open.set)

    def close(self) -> None:
        """Open for good (a failed test must not leave a search hanging at shutdown)."""
        self._shut = False
        if self._loop is not None and self._open is not None:
            self._loop.call_soon_threadsafe(self._open.set)

    async def search(self, scope: str, vector: np.ndarray, k: int) -> list[tuple[Entry, float]]:
        self.searches += 1
        if self._shut:
            if self._open is None:
                self._loop, self._open = asyncio.get_running_loop(), asyncio.Event()
            self.entered.set()
            await self._open.wait()
            if self.fail is not None:
                raise self.fail
        return await super().search(scope, vector, k)


@pytest.fixture
def held() -> HeldSearch:
    return HeldSearch()


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer], fake_server: FakeServer,
       held: HeldSearch) -> Iterator[GatewayServer]:
    """A gateway with the cache on ``held``; ``cheap-model``'s upstream allows a late hit to
    cancel it, ``fake-model``'s (a hosted API, as far as the gateway knows) does not."""
    gw = make_gateway(f"""
[upstreams.cheap]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{fake_server.url}/v1"
cancel_on_late_hit = true

[models."cheap-model"]
targets = [{{ upstream = "cheap", model = "cheap-upstream-model" }}]

[cache]
enabled = true
""", policy=POLICY, embed=bag_of_words)
    assert gw.gateway.cache is not None
    gw.gateway.cache.backend = held
    yield gw
    held.close()


def until(gw: GatewayServer, ready: Callable[[], object]) -> None:
    """Wait, on the gateway's loop, until ``ready()`` (state the loop itself changes)."""
    async def wait() -> None:
        while not ready():
            await asyncio.sleep(0.001)
    gw.run(wait())


def late_hits(gw: GatewayServer) -> dict[str, int]:
    assert gw.gateway.cache is not None
    return gw.gateway.cache.stats.late_hits


def in_background(call: Callable[[], Any]) -> Any:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def remember(gw: GatewayServer, model: str = "fake-model") -> None:
    """Store QUESTION's answer (the search open), so PARAPHRASE is a semantic hit."""
    assert chat(gw, ask(QUESTION), model=model).headers["x-cache"] == "miss"
    stored(gw)


def test_a_miss_goes_upstream_while_the_lookup_is_held(gw: GatewayServer, fake: FakeUpstream,
                                                       held: HeldSearch) -> None:
    remember(gw)
    held.shut()
    r = chat(gw, ask("how tall is the eiffel tower"))  # answered with the search still shut
    assert r.status_code == 200 and r.headers["x-cache"] == "miss"
    assert r.json()["choices"][0]["message"]["content"] == ANSWER
    assert held.entered.is_set() and len(fake.records) == 2
    log = gw.logged(2)[-1]
    assert (log["cache"], log["lookup_ms"], log["late_hit"]) == ("miss", None, None)
    held.open()
    stored(gw)  # stored once the lookup ended, with its embedding
    assert gw.gateway.cache is not None and gw.gateway.cache.stats.over_budget == 1
    assert chat(gw, ask("how tall is the eiffel tower please")).headers["x-cache"] == "hit"
    assert gw.logged(3)[-1]["cache_layer"] == "semantic"


def test_a_scope_with_no_entry_is_not_waited_for(gw: GatewayServer, fake: FakeUpstream,
                                                 held: HeldSearch) -> None:
    held.shut()
    r = chat(gw, ask(QUESTION))
    assert r.headers["x-cache"] == "miss" and held.searches == 0
    stored(gw)
    held.close()
    assert chat(gw, ask(PARAPHRASE)).headers["x-cache"] == "hit"
    assert gw.gateway.cache is not None and gw.gateway.cache.stats.over_budget == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_late_hit_cancels_the_upstream_and_is_served(gw: GatewayServer, fake: FakeUpstream,
                                                       held: HeldSearch, stream: bool) -> None:
    remember(gw, "cheap-model")
    held.shut()

    def ask_paraphrase() -> tuple[dict[str, str], str]:
        with client(gw, **{"x-fake-hold": "never"}) as c:
            if not stream:
                r = c.chat.completions.with_raw_response.create(
                    model="cheap-model", messages=ask(PARAPHRASE))
                return dict(r.headers), r.parse().choices[0].message.content or ""
            with c.chat.completions.with_streaming_response.create(
                    model="cheap-model", messages=ask(PARAPHRASE), stream=True) as s:
                text = "".join(x.choices[0].delta.content or "" for x in s.parse() if x.choices)
                return dict(s.headers), text

    answer = in_background(ask_paraphrase)
    fake.wait_for(lambda recs: len(recs) == 2)  # the upstream has it; the lookup is held
    held.open()
    headers, text = answer.result(10)
    assert headers["x-cache"] == "hit" and "x-cache-similarity" in headers
    assert text == ANSWER
    fake.wait_for(lambda recs: recs[1].disconnected is not None)  # its connection dropped
    assert fake.records[1].first_byte is None
    log = gw.logged(2)[-1]
    assert (log["cache"], log["cache_layer"], log["late_hit"]) == ("hit", "semantic", "served")
    assert log["upstream"] == "cheap" and log["status"] == 200
    assert late_hits(gw) == {"served": 1}
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'gateway_cache_late_hits_total{outcome="served"} 1.0' in metrics
    assert "gateway_cache_over_budget_total 1.0" in metrics


def test_a_late_hit_does_not_cancel_a_hosted_upstream_by_default(
        gw: GatewayServer, fake: FakeUpstream, held: HeldSearch) -> None:
    remember(gw)
    held.shut()
    answer = in_background(lambda: chat(gw, ask(PARAPHRASE), headers={"x-fake-hold": "h1"}))
    fake.wait_for(lambda recs: len(recs) == 2)
    held.open()
    until(gw, lambda: late_hits(gw))  # found, and left alone
    fake.release("h1")
    r = answer.result(10)
    assert r.status_code == 200 and r.headers["x-cache"] == "miss"
    assert "x-cache-similarity" not in r.headers
    assert fake.records[1].disconnected is None and fake.records[1].first_byte is not None
    log = gw.logged(2)[-1]
    assert (log["cache"], log["late_hit"], log["upstream"]) == ("miss", "ignored", "fake")
    assert log["similarity"] >= 0.8
    assert late_hits(gw) == {"ignored": 1}


def test_a_hit_within_the_budget_never_calls_the_upstream(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway("\n[cache]\nenabled = true\n", embed=bag_of_words,
                      policy=POLICY.replace("lookup_budget_ms = 1", "lookup_budget_ms = 60000"))
    remember(gw)
    r = chat(gw, ask(PARAPHRASE))
    assert r.headers["x-cache"] == "hit" and len(fake.records) == 1
    log = gw.logged(2)[-1]
    assert (log["cache_layer"], log["late_hit"], log["upstream"]) == ("semantic", None, None)
    assert gw.gateway.cache is not None and gw.gateway.cache.stats.over_budget == 0


def test_exact_hits_never_reach_the_semantic_layer(gw: GatewayServer, fake: FakeUpstream,
                                                   held: HeldSearch) -> None:
    remember(gw)
    searches = held.searches
    held.shut()
    with client(gw) as c:
        chunks = list(c.chat.completions.create(model="fake-model", messages=ask(QUESTION),
                                                stream=True))
    assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices) == ANSWER
    r = chat(gw, ask(QUESTION))
    assert r.headers["x-cache"] == "hit" and len(fake.records) == 1
    assert held.searches == searches and not held.entered.is_set()
    assert [log["cache_layer"] for log in gw.logged(3)[1:]] == ["exact", "exact"]


def test_a_stream_under_way_is_never_replaced(gw: GatewayServer, fake: FakeUpstream,
                                              held: HeldSearch) -> None:
    remember(gw, "cheap-model")
    held.shut()
    with client(gw) as c:  # the upstream answers at once: its stream is relayed
        text = "".join(x.choices[0].delta.content or "" for x in c.chat.completions.create(
            model="cheap-model", messages=ask(PARAPHRASE), stream=True) if x.choices)
    assert text == ANSWER
    held.open()
    stored(gw)
    assert late_hits(gw) == {"too_late": 1}
    log = gw.logged(2)[-1]
    assert (log["cache"], log["upstream"], log["status"]) == ("miss", "cheap", 200)
    assert fake.records[1].disconnected is None


@pytest.mark.parametrize("fault", [RuntimeError("search broke"), TimeoutError()])
def test_a_late_lookup_that_fails_never_fails_the_request(
        gw: GatewayServer, fake: FakeUpstream, held: HeldSearch, fault: Exception) -> None:
    remember(gw)
    held.shut()
    answer = in_background(lambda: chat(gw, ask(PARAPHRASE), headers={"x-fake-hold": "f"}))
    fake.wait_for(lambda recs: len(recs) == 2)
    held.open(fail=fault)
    assert gw.gateway.cache is not None
    until(gw, lambda: gw.gateway.cache is not None and gw.gateway.cache.stats.failures)
    fake.release("f")
    r = answer.result(10)
    assert r.status_code == 200 and r.headers["x-cache"] == "bypass"
    assert r.json()["choices"][0]["message"]["content"] == ANSWER
    assert gw.logged(2)[-1]["cache"] == "bypass"
    assert gw.gateway.cache.stats.failures == {"search": 1}


def test_a_client_leaving_mid_race_cancels_both(gw: GatewayServer, fake: FakeUpstream,
                                                held: HeldSearch) -> None:
    remember(gw, "cheap-model")
    held.shut()
    with pytest.raises(httpx.TimeoutException):  # both held: the client gives up
        httpx.post(gw.v1 + "/chat/completions", timeout=0.5, headers={"x-fake-hold": "x"},
                   json={"model": "cheap-model", "messages": ask("a question nobody waits for")})
    fake.wait_for(lambda recs: len(recs) == 2 and recs[1].disconnected is not None)
    log = gw.logged(2)[-1]
    assert log["cancelled"] and log["status"] == 499
    held.open()
    stored(gw)  # the lookup was cancelled: nothing stored, no late hit
    assert late_hits(gw) == {}
    r = chat(gw, ask("a question nobody waits for"), model="cheap-model")
    assert r.headers["x-cache"] == "miss"


@pytest.mark.parametrize(("kind", "flag", "cancels"), [
    ("local", None, True), ("openai", None, False), ("anthropic", None, False),
    ("openai", True, True), ("local", False, False)])
def test_which_upstreams_a_late_hit_may_cancel(kind: str, flag: bool | None,
                                               cancels: bool) -> None:
    config = UpstreamConfig(type=kind,  # type: ignore[arg-type]
                            base_url="" if kind == "local" else "http://127.0.0.1:9/v1",
                            cancel_on_late_hit=flag)
    assert build_upstream("u", config).cancel_on_late_hit is cancels


def test_the_router_waits_for_the_lookups_embedding(make_gateway: Callable[..., GatewayServer],
                                                    fake: FakeUpstream, tmp_path: Path) -> None:
    """Budget 0: the route stage runs while the cache's embedding is under way, and takes
    that one instead of computing its own."""
    calls, entered = [], threading.Event()
    loop_gate: list[asyncio.Event] = []

    async def held_embed(texts: list[str]) -> np.ndarray:
        calls.append(texts)
        if len(calls) == 1:
            loop_gate.append(asyncio.Event())
            entered.set()
            await loop_gate[0].wait()
        return await constant_embed(texts)

    policy = routing_policy(tiny_artifact(tmp_path / "tiny.npz")) + """
[cache]
enabled = true
semantic = true
lookup_budget_ms = 0
"""
    gw = make_gateway(MODELS + "\n[cache]\nenabled = true\n", policy=policy, embed=held_embed)
    answer = in_background(lambda: chat(gw, ask(HARD), model="auto"))
    assert entered.wait(5)
    assert gw.server is not None and gw.server.loop is not None
    gw.server.loop.call_soon_threadsafe(loop_gate[0].set)
    r = answer.result(10)
    assert r.headers["x-route-tier"] == "large" and "x-route-score" in r.headers
    assert len(calls) == 1


def test_a_shed_request_waits_for_a_late_lookup_no_longer_than_cache_wait_ms(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        held: HeldSearch) -> None:
    """Under a flood the embedder is behind: the degraded ``cache`` action waits at most
    ``degraded.cache_wait_ms`` for a lookup still under way, then the request is shed (the
    lookup here never ends until the test opens it)."""
    gw = make_gateway("[cache]\nenabled = true\n", embed=bag_of_words, policy=POLICY + """
[admission]
max_concurrency = 1
max_queue = 0

[degraded]
actions = ["cache", "reject"]
cache_wait_ms = 30
""")
    assert gw.gateway.cache is not None
    gw.gateway.cache.backend = held
    try:
        remember(gw)
        busy = in_background(lambda: chat(gw, ask("an unrelated question about tides"),
                                           headers={"x-fake-hold": "busy"}))
        fake.wait_for(lambda recs: len(recs) == 2)  # the one slot is taken
        held.shut()
        with pytest.raises(openai.InternalServerError) as raised:
            chat(gw, ask(PARAPHRASE))
        assert held.entered.is_set() and held._shut  # answered with the lookup still held
        shed = raised.value.response
        assert shed.status_code == 503
        assert shed.headers["x-gateway-degraded"] == "queue_full"
        assert shed.json()["error"]["code"] == "degraded_mode"
        log = gw.logged(2)[-1]
        assert (log["status"], log["shed"]) == (503, "queue_full")
        fake.release("busy")
        assert busy.result(10).status_code == 200
    finally:
        held.close()
