"""The response cache through the gateway, with the openai SDK as the client.

Embeddings here are a deterministic bag-of-words hash (sentences sharing most words are
close), and the verifier threshold is 0 unless a test says otherwise, so these tests pin
down scoping, storing and serving; the learned verifier is tested on its own. The lookup
budget is long here, so every lookup ends before the request goes on whatever the machine's
load; what happens past the budget is tested in test_lookup_budget.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.redis_server import RedisServer
from gateway.testing.server import free_port
from tests.conftest import DEFAULT_POLICY, GatewayServer

CACHE_POLICY = DEFAULT_POLICY + """
[cache]
enabled = true
semantic = true
ttl_s = 600
max_temperature = 1.0
# a static operating point (no error bound): these tests are about the lookup's machinery
max_error_rate = 0
operating_point = { similarity = 0.8, verifier = 0.0 }
relaxed = { similarity = 0.3, verifier = 0.0 }
lookup_budget_ms = 60000
"""
MEMORY = "\n[cache]\nenabled = true\nbackend = \"memory\"\n"


def _word_vector(word: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=64)


async def bag_of_words(texts: list[str]) -> np.ndarray:
    out = []
    for text in texts:
        v = sum((_word_vector(w) for w in re.findall(r"\w+", text.lower())), np.zeros(64))
        out.append(v / (np.linalg.norm(v) or 1.0))
    return np.array(out, dtype=np.float32)


@pytest.fixture
def cached(make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> GatewayServer:
    return make_gateway(MEMORY, policy=CACHE_POLICY, embed=bag_of_words)


def client(gw: GatewayServer, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0,
                         default_headers=headers or None)


def ask(text: str, system: str | None = None) -> list[dict[str, Any]]:
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}]


def chat(gw: GatewayServer, messages: list[dict[str, Any]], model: str = "fake-model",
         headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
    with client(gw, **(headers or {})) as c:
        r = c.chat.completions.with_raw_response.create(model=model, messages=messages,
                                                        **kwargs)
        r.http_response.read()
        return r.http_response


def stored(gw: GatewayServer) -> None:
    """Wait until the background stores of the requests so far are done."""
    cache = gw.gateway.cache
    assert cache is not None
    gw.run(cache.drain())


def test_exact_hit_skips_the_upstream(cached: GatewayServer, fake: FakeUpstream) -> None:
    first = chat(cached, ask("What is the capital of France?"))
    assert first.headers["x-cache"] == "miss"
    stored(cached)
    second = chat(cached, ask("What is the capital of France?"))
    assert second.headers["x-cache"] == "hit"
    assert second.json()["choices"][0]["message"]["content"] == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert len(fake.records) == 1
    log = cached.logged(2)[-1]
    assert (log["cache"], log["cache_layer"], log["status"]) == ("hit", "exact", 200)
    assert log["lookup_ms"] is not None and log["upstream"] is None
    # The hit's usage is the stored answer's counts (clients budget their context from
    # them), its whole prompt counted as cached; the tokens upstreams billed (metrics) count
    # the first request only.
    usage, hit_usage = first.json()["usage"], second.json()["usage"]
    assert (hit_usage["prompt_tokens"], hit_usage["completion_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"])
    assert hit_usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
    assert log["prompt_tokens"] == first.json()["usage"]["prompt_tokens"]
    metrics = httpx.get(cached.url + "/metrics").text
    prompt = [line for line in metrics.splitlines()
              if line.startswith("gateway_tokens_total{") and 'kind="prompt"' in line]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in prompt) == usage["prompt_tokens"]


def test_semantic_hit_and_headers(cached: GatewayServer, fake: FakeUpstream) -> None:
    chat(cached, ask("what is the capital city of france"))
    stored(cached)
    hit = chat(cached, ask("what is the capital city of france please"))
    assert hit.headers["x-cache"] == "hit"
    assert 0.8 <= float(hit.headers["x-cache-similarity"]) < 1.0
    assert len(fake.records) == 1
    log = cached.logged(2)[-1]
    assert log["cache_layer"] == "semantic" and log["similarity"] >= 0.8
    miss = chat(cached, ask("how tall is the eiffel tower"))
    assert miss.headers["x-cache"] == "miss"


def test_streamed_hit_is_parsed_by_the_sdk(cached: GatewayServer, fake: FakeUpstream) -> None:
    chat(cached, ask("tell me a joke"))
    stored(cached)
    with client(cached) as c:
        chunks = list(c.chat.completions.create(
            model="fake-model", messages=ask("tell me a joke"), stream=True,
            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert len(fake.records) == 1


def test_a_streamed_miss_near_a_stored_question_says_so_in_its_head(
        cached: GatewayServer, fake: FakeUpstream) -> None:
    """A near question (a candidate at the relaxed point, not a hit) streamed: the head goes
    out once the upstream accepts, and carries ``x-cache: miss`` all the same."""
    chat(cached, ask("how do i bake bread at home"))
    stored(cached)
    with client(cached) as c, c.chat.completions.with_streaming_response.create(
            model="fake-model", messages=ask("how do i bake a cake quickly"),
            stream=True) as r:
        assert r.headers["x-cache"] == "miss"
        assert "".join(x.choices[0].delta.content or "" for x in r.parse() if x.choices)
    assert len(fake.records) == 2
    assert cached.logged(2)[-1]["similarity"] >= 0.3  # a candidate, served nothing


def test_streamed_answers_are_stored(cached: GatewayServer, fake: FakeUpstream) -> None:
    with client(cached) as c:
        stream = c.chat.completions.create(model="fake-model", messages=ask("stream me"),
                                           stream=True)
        assert "".join(x.choices[0].delta.content or "" for x in stream if x.choices)
    stored(cached)
    again = chat(cached, ask("stream me"))
    assert again.headers["x-cache"] == "hit"
    assert again.json()["choices"][0]["message"]["content"] == "w0 w1 w2 w3 w4 w5 w6 w7"


@pytest.mark.parametrize("change", [
    {"headers": {"x-gateway-cache-namespace": "tenant-b"}},
    {"model": "with-fallback"},
    {"system": "You are a pirate."},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    {"history": True},
    {"response_format": {"type": "json_object"}},
])
def test_no_hit_across_scopes(cached: GatewayServer, fake: FakeUpstream,
                              change: dict[str, Any]) -> None:
    chat(cached, ask("what is the capital city of france", system="Be brief."))
    stored(cached)
    messages = ask("what is the capital city of france", system=change.get("system",
                                                                             "Be brief."))
    if change.get("history"):
        messages = [messages[0], {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"}, messages[1]]
    kwargs = {k: v for k, v in change.items() if k in ("tools", "response_format")}
    r = chat(cached, messages, model=change.get("model", "fake-model"),
             headers=change.get("headers"), **kwargs)
    assert r.headers["x-cache"] == "miss"


@pytest.mark.parametrize("kwargs", [{"temperature": 1.5}, {"n": 2}, {"logprobs": True},
                                    {"tool_choice": "required", "tools": [{
                                        "type": "function",
                                        "function": {"name": "f", "parameters": {}}}]}])
def test_disallowed_sampling_bypasses(cached: GatewayServer, fake: FakeUpstream,
                                      kwargs: dict[str, Any]) -> None:
    for _ in range(2):
        r = chat(cached, ask("same question"), **kwargs)
        assert r.headers["x-cache"] == "bypass"
    stored(cached)
    assert len(fake.records) == 2
    assert chat(cached, ask("same question")).headers["x-cache"] == "miss"


def test_no_cache_and_no_store(cached: GatewayServer, fake: FakeUpstream) -> None:
    chat(cached, ask("q1"), headers={"cache-control": "no-store"})
    stored(cached)
    assert chat(cached, ask("q1")).headers["x-cache"] == "miss"  # was not stored
    stored(cached)
    r = chat(cached, ask("q1"), headers={"cache-control": "no-cache"})
    assert r.headers["x-cache"] == "bypass"  # stored, but the lookup was skipped
    assert chat(cached, ask("q1")).headers["x-cache"] == "hit"
    assert len(fake.records) == 3


@pytest.mark.parametrize("headers", [{"x-fake-status": "500"}, {"x-fake-finish": "length"}])
def test_errors_and_truncated_answers_are_not_stored(cached: GatewayServer, fake: FakeUpstream,
                                                     headers: dict[str, str]) -> None:
    with pytest.raises(openai.APIError) if "x-fake-status" in headers else _nothing():
        chat(cached, ask("fragile"), headers=headers)
    stored(cached)
    assert chat(cached, ask("fragile")).headers["x-cache"] == "miss"


def test_broken_and_cancelled_streams_are_not_stored(cached: GatewayServer,
                                                     fake: FakeUpstream) -> None:
    with client(cached, **{"x-fake-die-after": "3"}) as c, pytest.raises(openai.APIError):
        list(c.chat.completions.create(model="fake-model", messages=ask("dies"), stream=True))
    with client(cached, **{"x-fake-itl-ms": "200", "x-fake-tokens": "50"}) as c:
        stream = c.chat.completions.create(model="fake-model", messages=ask("leaves"),
                                           stream=True)
        next(iter(stream))
        stream.close()
    fake.wait_for(lambda recs: any(r.disconnected is not None for r in recs))
    stored(cached)
    assert chat(cached, ask("dies")).headers["x-cache"] == "miss"
    assert chat(cached, ask("leaves")).headers["x-cache"] == "miss"


def test_purge_namespace(cached: GatewayServer, fake: FakeUpstream) -> None:
    chat(cached, ask("purge me"))
    chat(cached, ask("purge me"), headers={"x-gateway-cache-namespace": "keep"})
    stored(cached)
    r = httpx.post(cached.url + "/admin/cache/purge", json={"namespace": "default"})
    assert r.status_code == 200 and r.json()["removed"] == 1
    assert chat(cached, ask("purge me")).headers["x-cache"] == "miss"
    kept = chat(cached, ask("purge me"), headers={"x-gateway-cache-namespace": "keep"})
    assert kept.headers["x-cache"] == "hit"


def test_degraded_mode_serves_a_relaxed_hit(make_gateway: Callable[..., GatewayServer],
                                            fake: FakeUpstream) -> None:
    policy = CACHE_POLICY.replace("[cache]", """
[admission]
max_concurrency = 1
max_queue = 0

[degraded]
actions = ["cache", "reject"]

[cache]""")
    gw = make_gateway(MEMORY, policy=policy, embed=bag_of_words)
    chat(gw, ask("what is the capital city of france"))
    stored(gw)
    slow = client(gw, **{"x-fake-ttft-ms": "1500"})
    holder = threading.Thread(target=lambda: _quietly(lambda: slow.chat.completions.create(
        model="fake-model", messages=ask("hold the only slot"))))
    holder.start()
    fake.wait_for(lambda recs: any(r.json["messages"][0]["content"] == "hold the only slot"
                                   for r in recs))
    near = chat(gw, ask("capital of france"))  # below 0.8, above the relaxed 0.3
    assert near.headers["x-cache"] == "hit"
    assert near.headers["x-gateway-degraded"] == "cache:queue_full"
    with pytest.raises(openai.APIStatusError) as info:
        chat(gw, ask("something else entirely"))
    assert info.value.status_code == 503
    holder.join(10)
    slow.close()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _quietly(call: Callable[[], object]) -> None:
    try:
        call()
    except openai.APIError:
        pass


# -- Redis faults ----------------------------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung Redis)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("kind", ["down", "hung"])
def test_redis_down_or_hung_bypasses_within_the_timeout(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream, silent_port: int,
        kind: str) -> None:
    port = free_port() if kind == "down" else silent_port
    gw = make_gateway(f'\n[cache]\nenabled = true\nbackend = "redis"\n'
                      f'redis_url = "redis://127.0.0.1:{port}/0"\n', policy=CACHE_POLICY,
                      embed=bag_of_words)
    for _ in range(2):
        r = chat(gw, ask("is redis there"))
        assert r.status_code == 200 and r.headers["x-cache"] == "bypass"
    logs = gw.logged(2)
    assert all(log["cache"] == "bypass" and log["lookup_ms"] < 500 for log in logs)
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'gateway_cache_failures_total{op="get"}' in metrics


def test_redis_backend_serves_hits_and_reconnects(make_gateway: Callable[..., GatewayServer],
                                                  fake: FakeUpstream) -> None:
    port = free_port()
    gw = make_gateway(f'\n[cache]\nenabled = true\nbackend = "redis"\n'
                      f'redis_url = "redis://127.0.0.1:{port}/0"\n', policy=CACHE_POLICY,
                      embed=bag_of_words)
    assert chat(gw, ask("before redis")).headers["x-cache"] == "bypass"
    with RedisServer(port=port):
        first = chat(gw, ask("what is the capital city of france"))
        assert first.headers["x-cache"] == "miss"
        stored(gw)
        assert chat(gw, ask("what is the capital city of france")).headers["x-cache"] == "hit"
        near = chat(gw, ask("what is the capital city of france please"))
        assert near.headers["x-cache"] == "hit"
        assert gw.logged(4)[-1]["cache_layer"] == "semantic"


def test_semantic_hit_respects_max_tokens(cached: GatewayServer, fake: FakeUpstream) -> None:
    chat(cached, ask("what is the capital city of france"))  # 8 completion tokens
    stored(cached)
    short = chat(cached, ask("what is the capital city of france please"), max_tokens=4)
    assert short.headers["x-cache"] == "miss"
    long = chat(cached, ask("what is the capital city of france please"), max_tokens=40)
    assert long.headers["x-cache"] == "hit"


def test_a_saturated_embedder_is_skipped_not_queued(make_gateway: Callable[..., GatewayServer],
                                                   fake: FakeUpstream) -> None:
    entered, release = threading.Event(), threading.Event()

    async def slow_embed(texts: list[str]) -> np.ndarray:
        entered.set()
        await asyncio.to_thread(release.wait, 5)
        return await bag_of_words(texts)

    gw = make_gateway(MEMORY, policy=CACHE_POLICY + "max_pending_embeddings = 1\n",
                      embed=slow_embed)
    first = threading.Thread(target=lambda: chat(gw, ask("first question")))
    first.start()
    assert entered.wait(5)
    second = chat(gw, ask("second question"))  # does not wait for the busy embedder
    assert second.status_code == 200 and second.headers["x-cache"] == "miss"
    release.set()
    first.join(10)
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'gateway_cache_failures_total{op="embed_busy"} 1.0' in metrics
