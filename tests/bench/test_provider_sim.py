"""The provider simulator (bench/provider_sim.py) as a client sees it: the official SDKs parse
its streams, cached prompts answer sooner, limits answer 429 with retry-after, faults fire at
their rate, bills add up. Latencies are shrunk so the whole file runs in a few seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from bench.provider_sim import ProviderSim, key_id
from bench.provider_sim_engine import Engine, OverflowOpenAICache, SimError, cost_usd
from bench.provider_sim_params import ModelSpec, SimParams
from gateway.testing.cache_sim import Tokenizer
from gateway.testing.server import ServerThread

ROOT = Path(__file__).resolve().parents[2]
CLAUDE = "claude-sonnet-4-6"
#: exact and fast: no noise, no tail, no faults, small times
QUIET = {"ttft_sigma": 0.0, "tail_share": 0.0, "tpot_sigma": 0.0, "fault_500": 0.0,
         "fault_overloaded": 0.0, "fault_stall": 0.0, "fault_cut": 0.0, "base_ms": 5.0,
         "ms_per_uncached_token": 0.02, "ms_per_cached_token": 0.002, "tpot_ms": 1.0,
         "out_min": 5, "out_max": 20}


def _sim(**overrides: Any) -> Iterator[tuple[str, ProviderSim]]:
    app = ProviderSim(SimParams.from_dict({**QUIET, **overrides}))
    with ServerThread(app) as srv:
        yield srv.url, app


@pytest.fixture
def sim() -> Iterator[tuple[str, ProviderSim]]:
    yield from _sim()


def _words(n: int, tag: str) -> str:
    return tag + " " + " ".join(f"w{i % 97}" for i in range(n))


_CLIENTS: list[Any] = []


def _closed_after(client: Any) -> Any:
    """``client`` (an SDK's), closed when the test ends: its pooled sockets, a cut one
    included, are not left to the garbage collector (a ResourceWarning in a later test)."""
    _CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def _openai_ttft(client: openai.OpenAI, prompt: str, **kw: Any) -> tuple[float, Any, str]:
    """Client-measured TTFT (s), the usage and the text of one streamed chat."""
    start, first, text, usage = time.monotonic(), None, "", None
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": prompt}], stream=True,
        stream_options={"include_usage": True}, **kw)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.monotonic()
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    assert first is not None
    return first - start, usage, text


def _claude_stream(client: anthropic.Anthropic, system: str) -> tuple[float, Any]:
    start, first = time.monotonic(), None
    with client.messages.stream(
            model=CLAUDE, max_tokens=50, messages=[{"role": "user", "content": "hello"}],
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
    ) as stream:
        for event in stream:
            if event.type == "text":
                first = first or time.monotonic()
        message = stream.get_final_message()
    assert first is not None and message.stop_reason == "end_turn"
    return first - start, message.usage


def test_openai_cached_prompt_answers_sooner_and_cheaper(sim: tuple[str, ProviderSim]) -> None:
    url, app = sim
    client = _closed_after(openai.OpenAI(base_url=url + "/v1", api_key="k-openai", max_retries=0))
    prompt = _words(2500, "same prefix")
    cold, cold_usage, cold_text = _openai_ttft(client, prompt)
    warm, warm_usage, warm_text = _openai_ttft(client, prompt)
    assert cold_usage.prompt_tokens_details.cached_tokens == 0
    assert warm_usage.prompt_tokens_details.cached_tokens >= 4000
    assert warm < cold / 2, (warm, cold)
    assert warm_text == cold_text  # deterministic answer for the same prompt
    costs = [r["cost_usd"] for r in app.requests]
    assert costs[1] < costs[0]


def test_anthropic_cache_write_then_read(sim: tuple[str, ProviderSim]) -> None:
    url, app = sim
    client = _closed_after(anthropic.Anthropic(base_url=url, api_key="k-claude", max_retries=0))
    system = _words(2500, "system")
    cold, written = _claude_stream(client, system)
    warm, read = _claude_stream(client, system)
    assert written.cache_creation_input_tokens > 4000 and written.cache_read_input_tokens == 0
    assert read.cache_read_input_tokens == written.cache_creation_input_tokens
    assert warm < cold / 2, (warm, cold)
    first, second = app.requests
    # billing: writes at 1.25x $3, reads at 0.1x $3, input $3, output $15 per 1M tokens
    assert first["cost_usd"] == pytest.approx(
        (written.input_tokens * 3 + written.cache_creation_input_tokens * 3.75
         + written.output_tokens * 15) / 1e6)
    assert second["cost_usd"] == pytest.approx(
        (read.input_tokens * 3 + read.cache_read_input_tokens * 0.3 + read.output_tokens * 15)
        / 1e6)


def test_ttft_grows_with_uncached_tokens_as_stated() -> None:
    for url, app in _sim(ms_per_uncached_token=0.05):
        client = _closed_after(openai.OpenAI(base_url=url + "/v1", api_key="k-sizes", max_retries=0))
        _openai_ttft(client, "warm the connection")
        seen = [_openai_ttft(client, _words(n, f"size {n}"))[0] for n in (100, 800, 2400)]
        assert seen[0] < seen[1] < seen[2]
        for record in app.requests:  # the stated model, exactly, without noise
            assert record["ttft_ms"] == pytest.approx(5.0 + 0.05 * record["prompt_tokens"],
                                                      abs=0.01)
            assert record["served_ttft_ms"] >= record["ttft_ms"]


def test_rate_limit_answers_429_with_retry_after() -> None:
    limited = [ModelSpec("gpt-4o", "openai", 2.5, 1.25, 10.0, tpm=3000),
               ModelSpec(CLAUDE, "anthropic", 3.0, 0.3, 15.0, 3.75, 6.0, itpm=3000,
                         otpm=10_000)]
    for url, _app in _sim(models=[m.to_dict() for m in limited]):
        with httpx.Client(base_url=url) as http:
            body = {"model": "gpt-4o", "max_tokens": 500,
                    "messages": [{"role": "user", "content": _words(1000, "big")}]}
            auth = {"authorization": "Bearer k-limit"}
            chat = "/v1/chat/completions"
            assert http.post(chat, json=body, headers=auth).status_code == 200
            refused = http.post(chat, json=body, headers=auth)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            wait_ms = int(refused.headers["retry-after-ms"])  # refills at 3000 a minute
            assert wait_ms > 1000 and int(refused.headers["retry-after"]) == -(-wait_ms // 1000)
            other = http.post(chat, json=body, headers={"authorization": "Bearer k-other"})
            assert other.status_code == 200  # limits are per key (organisation)

            heads = {"x-api-key": "k-limit", "anthropic-version": "2023-06-01"}
            msg = {"model": CLAUDE, "max_tokens": 20,
                   "messages": [{"role": "user", "content": _words(1200, "claude")}]}
            assert http.post("/v1/messages", json=msg, headers=heads).status_code == 200
            refused = http.post("/v1/messages", json=msg, headers=heads)
            assert refused.status_code == 429
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert int(refused.headers["retry-after"]) >= 1


def test_faults_fire_at_their_rate() -> None:
    unlimited = ModelSpec(CLAUDE, "anthropic", 3.0, 0.3, 15.0, 3.75, 6.0)
    params = SimParams.from_dict({**QUIET, "fault_500": 0.1, "fault_overloaded": 0.1,
                                  "fault_stall": 0.1, "fault_cut": 0.1,
                                  "models": [unlimited.to_dict()]})
    engine = Engine(params)
    engine.tokenizer = Tokenizer(encode=lambda text: [ord(c) for c in text[:50]])  # fast
    model = params.model(CLAUDE)
    assert model is not None
    kinds: dict[str | None, int] = {}
    n = 4000
    for i in range(n):
        body = {"model": CLAUDE, "max_tokens": 50, "messages": [{"role": "user",
                                                                  "content": f"q{i}"}]}
        try:
            kind = engine.plan("anthropic", "k", model, body).fault
        except SimError as exc:
            kind = exc.fault
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds["500"] / n == pytest.approx(0.1, abs=0.02)
    assert kinds["529"] / n == pytest.approx(0.1, abs=0.02)
    admitted = n - kinds["500"] - kinds["529"]  # stalls and cuts: shares of the admitted
    assert kinds["stall"] / admitted == pytest.approx(0.1, abs=0.02)
    assert kinds["cut"] / admitted == pytest.approx(0.1, abs=0.02)


def test_a_request_draws_the_same_whatever_came_before_it_and_a_retry_draws_anew() -> None:
    """Paths of a run are compared request by request: a proxy that served some requests
    itself (or marked the prompt for caching) must not shift the noise of the others."""
    params = SimParams.from_dict({**QUIET, "ttft_sigma": 0.5, "base_ms": 300.0})
    model = params.model(CLAUDE)
    assert model is not None

    def body(text: str, marked: bool = False) -> dict[str, Any]:
        content: Any = [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}] \
            if marked else text
        return {"model": CLAUDE, "max_tokens": 50, "system": "Be brief.",
                "messages": [{"role": "user", "content": content}]}

    direct, proxied = Engine(params), Engine(params)
    for i in range(5):  # only the direct path's provider sees these (a proxy's cache hits)
        direct.plan("anthropic", "k", model, body(f"popular question {i}"))
    first = direct.plan("anthropic", "k", model, body("the question")).ttft_ms
    assert proxied.plan("anthropic", "k", model, body("the question", marked=True)).ttft_ms \
        == pytest.approx(first, rel=0.05)  # the same draw (its cached prefix aside)
    again = direct.plan("anthropic", "k", model, body("the question")).ttft_ms
    assert again != pytest.approx(first, rel=0.01)  # sent again: a draw of its own


def test_injected_faults_reach_the_sdks_as_errors() -> None:
    for url, app in _sim(fault_cut=1.0, out_min=30, out_max=30):
        client = _closed_after(openai.OpenAI(base_url=url + "/v1", api_key="k-cut", max_retries=0))
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            _openai_ttft(client, "cut me")
        assert app.requests[-1]["fault"] == "cut"
        assert 0 < app.requests[-1]["output_tokens"] < 30
        assert app.requests[-1]["finish"] is None
    for url, app in _sim(fault_overloaded=1.0, error_delay_ms=0):
        claude = _closed_after(anthropic.Anthropic(base_url=url, api_key="k-529", max_retries=0))
        with pytest.raises(anthropic.APIStatusError) as info:
            claude.messages.create(model=CLAUDE, max_tokens=5,
                                   messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 529
        assert app.requests[-1]["fault"] == "529"


def test_stall_pauses_mid_stream() -> None:
    for url, app in _sim(fault_stall=1.0, stall_midstream_share=1.0, stall_pause_ms=150,
                         out_min=10, out_max=10):
        client = _closed_after(openai.OpenAI(base_url=url + "/v1", api_key="k-stall", max_retries=0))
        start = time.monotonic()
        _openai_ttft(client, "stall me")
        assert time.monotonic() - start >= 0.15
        assert app.requests[-1]["fault"] == "stall"
        assert app.requests[-1]["output_tokens"] == 10


def test_a_text_given_back_is_continued_as_a_continuing_server_would(
        sim: tuple[str, ProviderSim]) -> None:
    """An Anthropic prefill, or OpenAI's API with ``continue_final_message``, holding the
    start of the answer: the simulator sends what follows it, so the two read as the
    whole answer (issue 48's continuation, benchmarked on bench/workload.py)."""
    url = sim[0]
    claude = _closed_after(anthropic.Anthropic(base_url=url, api_key="k-cont", max_retries=0))
    ask = [{"role": "user", "content": "continue me"}]
    whole = claude.messages.create(model=CLAUDE, max_tokens=400, messages=ask)
    text = whole.content[0].text  # type: ignore[union-attr]
    said = " ".join(text.split()[:4])
    rest = claude.messages.create(model=CLAUDE, max_tokens=400, messages=[
        *ask, {"role": "assistant", "content": said}])
    assert said + rest.content[0].text == text  # type: ignore[union-attr]
    gpt = _closed_after(openai.OpenAI(base_url=url + "/v1", api_key="k-cont", max_retries=0))
    whole_gpt = gpt.chat.completions.create(model="gpt-4o", messages=ask)
    text = whole_gpt.choices[0].message.content or ""
    said = " ".join(text.split()[:4])
    rest_gpt = gpt.chat.completions.create(
        model="gpt-4o", messages=[*ask, {"role": "assistant", "content": said}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert said + (rest_gpt.choices[0].message.content or "") == text


def test_refusals_in_each_providers_format(sim: tuple[str, ProviderSim]) -> None:
    url, _app = sim
    oai = {"authorization": "Bearer k"}
    missing = httpx.post(url + "/v1/chat/completions", headers=oai,
                         json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    heads = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    block = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    five = {"model": CLAUDE, "max_tokens": 5, "system": [block] * 5,
            "messages": [{"role": "user", "content": "x"}]}
    too_many = httpx.post(url + "/v1/messages", headers=heads, json=five)
    assert too_many.status_code == 400
    assert too_many.json()["error"]["type"] == "invalid_request_error"
    no_version = httpx.post(url + "/v1/messages", headers={"x-api-key": "k"},
                            json={**five, "system": "x"})
    assert no_version.status_code == 400
    wrong_api = httpx.post(url + "/v1/messages", headers=heads, json={**five, "system": "x",
                                                                      "model": "gpt-4o"})
    assert wrong_api.status_code == 404 and wrong_api.json()["type"] == "error"


def test_stats_and_reset(sim: tuple[str, ProviderSim]) -> None:
    url, _app = sim
    client = _closed_after(openai.OpenAI(base_url=url + "/v1", api_key="k-stats", max_retries=0))
    reply = client.chat.completions.create(model="gpt-4o", max_tokens=3,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].finish_reason == "length" and reply.usage is not None
    stats = httpx.get(url + "/sim/stats").json()
    (record,) = stats["requests"]
    assert stats["params"]["base_ms"] == 5.0
    assert record["key"] == key_id("k-stats") and "k-stats" not in json.dumps(stats)
    assert record["output_tokens"] == 3 and record["status"] == 200
    assert record["cost_usd"] == pytest.approx(
        cost_usd(SimParams().models[0], reply.usage.prompt_tokens, 0, {}, 3))
    assert httpx.post(url + "/sim/reset", json={"seed": 7}).json()["seed"] == 7
    assert httpx.get(url + "/sim/stats").json()["requests"] == []


def test_params_round_trip_and_refuse_unknown_keys() -> None:
    params = SimParams.from_dict({"base_ms": 1.0, "models": [SimParams().models[0].to_dict()]})
    assert SimParams.from_dict(json.loads(json.dumps(params.to_dict()))) == params
    with pytest.raises(ValueError, match="bogus"):
        SimParams.from_dict({"bogus": 1})


def test_openai_overflow_spreads_a_hot_prefix_over_machines() -> None:
    clock = [0.0]
    cache = OverflowOpenAICache(Tokenizer(encode=lambda t: [ord(c) for c in t]),
                                lambda: clock[0], machines=8, ttl_s=300, per_min=3)
    body = {"messages": [{"role": "user", "content": "x" * 1500}], "prompt_cache_key": "c1"}
    seen = []
    for _ in range(6):
        seen.append(cache.usage(body))
        clock[0] += 1.0
    assert len({u.machine for u in seen[:3]}) == 1  # under the rate: the home machine
    assert len({u.machine for u in seen[3:]}) == 2  # over it: spread over two
    assert seen[3].cached_tokens == 0  # sent to a cold machine: no cache read
    assert seen[5].cached_tokens > 0  # which is warm the next time round


def test_cli_prints_ready_records_and_stops_on_sigterm(tmp_path: Path) -> None:
    record = tmp_path / "requests.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.provider_sim", "--port", "0", "--record", str(record),
         "--params", json.dumps(QUIET)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("READY http://127.0.0.1:")
        url = line.split()[1]
        reply = httpx.post(url + "/v1/chat/completions", headers={"authorization": "Bearer s"},
                           json={"model": "gpt-4o", "messages": [{"role": "user",
                                                                  "content": "hi"}]})
        assert reply.status_code == 200
        assert reply.json()["object"] == "chat.completion"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    (entry,) = [json.loads(x) for x in record.read_text().splitlines()]
    assert entry["path"] == "/v1/chat/completions" and entry["body"]["model"] == "gpt-4o"
    assert "authorization" not in entry["headers"]
