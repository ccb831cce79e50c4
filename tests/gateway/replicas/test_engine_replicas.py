"""Two real engine replicas (a tiny model, small KV) behind one gateway pool: a conversation's
turns land on the replica holding its prefix, and a replica killed mid-load loses no
request. One pair of engines serves the whole module; the kill comes last."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing.server import ServerThread
from gateway.upstreams.ports import free_port
from tests.conftest import wait_until_ready


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """Two engines on loopback: (base URL, process) each."""
    started = []
    for _ in range(2):
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "local_engine", "--port", str(port), "--model",
             str(tiny_model_dir), "--kv-cache-mb", "8", "--max-num-seqs", "8",
             "--max-model-len", "512", "--default-max-tokens", "8", "--dtype", "float32",
             "--max-step-slowdown", "0", "--speculative", "off", "--no-embeddings"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append((f"http://127.0.0.1:{port}", process))
    try:
        for url, process in started:
            wait_until_ready(url, process, 120, "/healthz")
        yield started
    finally:
        for _, process in started:
            process.kill()
            process.wait()


def _gateway(tmp_path: Path, urls: list[str], routing: str, tokenizer: Path) -> Any:
    (tmp_path / "policy.toml").write_text('version = "t"\n')
    replicas = ", ".join(f'"{u}/v1"' for u in urls)
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
[server]
policy = "policy.toml"
policy_reload = false

[logging]
requests = false

[upstreams.engines]
type = "openai"
replicas = [{replicas}]
connect_timeout_ms = 500

[upstreams.engines.pool]
routing = "{routing}"
tokenizer = "{tokenizer}"
health_interval_s = 0.2
events_interval_s = 0.05

[models.tiny]
targets = [{{ upstream = "engines", model = "tiny" }}]
""")
    return create_app(load_config(path))


def _held(url: str) -> set[int]:
    return set(httpx.get(url + "/kv_events").json()["snapshot"])


@pytest.mark.parametrize("routing", ["prefix_precise", "prefix"])
def test_each_conversation_stays_on_the_replica_holding_its_prefix(
        tmp_path: Path, tiny_model_dir: Path, engines: list[tuple[str, Any]],
        routing: str) -> None:
    urls = [u for u, _ in engines]
    app = _gateway(tmp_path, urls, routing, tiny_model_dir)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        histories = [[{"role": "system", "content": f"You are agent {c} of {routing}. " * 12}]
                     for c in range(3)]  # odd: round robin would alternate each turn
        cached: list[list[int]] = [[] for _ in histories]
        for turn in range(3):
            for c, history in enumerate(histories):
                history.append({"role": "user", "content": f"turn {turn} of conversation {c}"})
                r = client.chat.completions.create(model="tiny", messages=history,  # type: ignore[arg-type]
                                                   max_tokens=4)
                assert r.usage is not None and r.usage.prompt_tokens_details is not None
                cached[c].append(r.usage.prompt_tokens_details.cached_tokens or 0)
                history.append({"role": "assistant", "content": r.choices[0].message.content})
        pool = app.gateway.upstreams["engines"]
        deadline = time.monotonic() + 30
        while pool.capacity != 16 and time.monotonic() < deadline:  # its health reads
            time.sleep(0.05)
        assert pool.capacity == 16  # admission takes both engines' batches (8 each)
        if routing == "prefix_precise":  # the gateway computes the very hashes engines hold
            for history in histories:
                body = {"model": "tiny", "messages": history[:-1]}
                keys = set(pool.engine_keys.keys(body, pool.block_size))
                holders = [u for u in urls if keys <= _held(u)]
                assert len(keys) > 5 and len(holders) == 1
    for c, seen in enumerate(cached):
        # every later turn reuses (nearly) all of the prompt before it: the same replica
        assert seen[1] > 100 and seen[2] > seen[1], (c, seen)
    assert all(_held(u) for u in urls)  # the conversations were spread over both


def test_killing_a_replica_loses_no_request(tmp_path: Path, tiny_model_dir: Path,
                                            engines: list[tuple[str, Any]]) -> None:
    urls = [u for u, _ in engines]
    (victim_url, victim), _ = engines
    app = _gateway(tmp_path, urls, "least_load", tiny_model_dir)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        results: list[str] = []

        def ask(i: int) -> None:
            try:
                r = client.chat.completions.create(
                    model="tiny", max_tokens=200,
                    messages=[{"role": "user", "content": f"question {i}"}])
                results.append(r.choices[0].finish_reason or "?")
            except openai.APIError as exc:
                results.append(f"error {exc}")

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        with httpx.Client() as http:  # the victim is working on some of them: kill it now
            while (http.get(victim_url + "/healthz").json()["load"]["running"] == 0
                   and any(t.is_alive() for t in threads)):
                pass
        victim.kill()
        victim.wait()
        for t in threads:
            t.join(60)
        after = [client.chat.completions.create(model="tiny", max_tokens=4, messages=[
            {"role": "user", "content": f"after {i}"}]).choices[0].finish_reason
            for i in range(4)]
    assert len(results) == 8 and not [r for r in results if r.startswith("error")], results
    assert all(after)
