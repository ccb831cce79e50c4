"""Graceful shutdown as clients see it: SIGTERM to `gateway serve` never hangs a stream, a
short stream still finishes, a long one ends with an error event, and the process exits
within its drain timeout; while draining, /readyz is 503 and new requests are refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.upstreams.ports import free_port
from tests.conftest import DEFAULT_POLICY, FakeServer, GatewayServer, gateway_toml, wait_until_ready

DRAIN_S = 4.0  # the deadline falls 2 s after SIGTERM


@pytest.fixture
def served(tmp_path: Path, fake_server: FakeServer):
    (tmp_path / "policy.toml").write_text(DEFAULT_POLICY)
    config = gateway_toml(fake_server.url).replace(
        "[server]\n", f"[server]\ndrain_timeout_s = {DRAIN_S}\n", 1)
    (tmp_path / "gateway.toml").write_text(config)
    port = free_port()
    stderr = (tmp_path / "stderr.txt").open("wb")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "gateway"), "serve", "--config",
         str(tmp_path / "gateway.toml"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url, process, timeout=30)
    yield process, url, tmp_path / "stderr.txt"
    if process.poll() is None:
        process.kill()
        process.wait()
    stderr.close()


def events(lines: list[str]) -> list[str]:
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def test_sigterm_lets_short_streams_finish_ends_long_ones_and_exits_in_time(served, fake):
    process, url, stderr = served
    body = {"model": "fake-model", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=30) as client, \
         client.stream("POST", url + "/v1/chat/completions", json=body, headers={
             "x-fake-itl-ms": "200", "x-fake-tokens": "200"}) as long, \
         client.stream("POST", url + "/v1/chat/completions", json=body, headers={
             "x-fake-itl-ms": "100", "x-fake-tokens": "8"}) as short:
        long_lines, short_lines = long.iter_lines(), short.iter_lines()
        first = [next(long_lines), next(short_lines)]  # both streams under way
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        short_rest = [first[1], *short_lines]
        long_rest = [first[0], *long_lines]
        ended = time.monotonic() - sent
    assert events(short_rest)[-1] == "[DONE]"  # finished within the drain
    last = events(long_rest)
    assert last[-1] != "[DONE]"
    error = orjson.loads(last[-1])["error"]
    assert error["code"] == "shutting_down" and error["type"] == "overloaded_error"
    assert ended < DRAIN_S
    # uvicorn re-raises the signal once shut down: the status says SIGTERM, after the drain.
    assert process.wait(timeout=DRAIN_S) in (0, -signal.SIGTERM)
    assert time.monotonic() - sent < DRAIN_S + 1
    assert b"Traceback" not in stderr.read_bytes()


def test_while_draining_readyz_is_503_and_new_requests_are_refused(gw: GatewayServer, fake):
    async def begin() -> None:
        gw.gateway.drain.begin(60.0)
    gw.run(begin())
    r = httpx.get(gw.url + "/readyz")
    assert r.status_code == 503 and r.json()["status"] == "draining"
    r = httpx.post(gw.v1 + "/chat/completions",
                   json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    assert r.headers["retry-after"] == "1"
    r = httpx.post(gw.url + "/v1/messages", headers={"anthropic-version": "2023-06-01"},
                   json={"model": "fake-model", "max_tokens": 8,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "overloaded_error"
    assert not fake.records
