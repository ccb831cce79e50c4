"""Fixtures shared by the whole suite: a fake OpenAI upstream and gateways in front of it.

Both run under uvicorn on loopback ports in background threads, so tests talk real HTTP with
the official SDKs, and client disconnects reach the servers as they would in production.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.policy import PolicyStore
from gateway.state import Gateway
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread
from tests import warm_caches

DEFAULT_POLICY = """
version = "test-1"
[retry]
max_attempts = 3
base_delay_ms = 1
max_delay_ms = 5
max_retry_after_ms = 2000
"""


_WARMING = pytest.StashKey[subprocess.Popen[bytes]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """On a fresh machine, fill the model caches in the background (tests.warm_caches)."""
    if warm_caches.cold():
        session.config.stash[_WARMING] = subprocess.Popen(
            [sys.executable, "-m", "tests.warm_caches"], cwd=Path(__file__).parents[1],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_sessionfinish(session: pytest.Session) -> None:
    warming = session.config.stash.get(_WARMING, None)
    if warming is not None and warming.poll() is None:  # a short session: stop it, letting
        warming.send_signal(signal.SIGINT)  # it remove what it had half written
        try:
            warming.wait(10)
        except subprocess.TimeoutExpired:
            warming.kill()
            warming.wait()


@dataclass
class FakeServer:
    app: FakeUpstream
    url: str


class LogSink:
    """Collects the gateway's request log records; ``wait(n)`` blocks until n arrived (the
    line is written after the last byte is sent, so a client can finish before it exists)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def __call__(self, record: dict[str, Any]) -> None:
        with self._cond:
            self.records.append(record)
            self._cond.notify_all()

    def wait(self, n: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.records) >= n, timeout):
                raise TimeoutError(f"expected {n} request log records, got {len(self.records)}")
            return list(self.records)


@dataclass
class GatewayServer:
    url: str
    gateway: Gateway
    policy_path: Path
    sink: LogSink = field(default_factory=LogSink)
    server: ServerThread | None = None

    def run(self, coro: Any, timeout: float = 5.0) -> Any:
        """Run a coroutine on the gateway's own event loop and wait for its result."""
        assert self.server is not None and self.server.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.server.loop).result(timeout)

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def logged(self, n: int = 1) -> list[dict[str, Any]]:
        """The request log records, once at least ``n`` were written."""
        return self.sink.wait(n)


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeServer]:
    app = FakeUpstream()
    with ServerThread(app) as srv:
        yield FakeServer(app, srv.url)


@pytest.fixture(scope="module")
def claude_server() -> Iterator[tuple[FakeAnthropic, str]]:
    """A fake Anthropic upstream (its key ``sk-ant-upstream``) for a module's tests; a
    module that needs another (e.g. with its prompt cache simulated) defines its own."""
    app = FakeAnthropic(api_key="sk-ant-upstream")
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def fake(fake_server: FakeServer) -> FakeUpstream:
    fake_server.app.clear()
    return fake_server.app


def gateway_toml(fake_url: str, extra: str = "") -> str:
    """The test gateway's config: upstreams on the fake (which tests steer with
    ``x-fake-*`` headers, forwarded by ``forward_headers``), and their models."""
    return f"""
[server]
policy = "policy.toml"
max_body_bytes = 65536

[logging]
requests = false

[upstreams.fake]
type = "openai"
base_url = "{fake_url}/v1"
read_timeout_ms = 2000
forward_headers = ["x-fake-*"]

[upstreams.backup]
type = "openai"
base_url = "{fake_url}/backup/v1"
forward_headers = ["x-fake-*"]

[upstreams.dead]
type = "openai"
base_url = "http://127.0.0.1:9/v1"
connect_timeout_ms = 200

[upstreams.short]
type = "openai"
base_url = "{fake_url}/v1"
read_timeout_ms = 300
forward_headers = ["x-fake-*"]

[upstreams.keyless]
type = "openai"
base_url = "{fake_url}/v1"
api_key_env = "GATEWAY_TEST_UNSET_KEY"

[models."fake-model"]
targets = [{{ upstream = "fake", model = "fake-upstream-model" }}]
aliases = ["fm"]

[models."with-fallback"]
targets = [{{ upstream = "dead", model = "x" }}, {{ upstream = "backup", model = "backup-model" }}]

[models."short-timeout"]
targets = [{{ upstream = "short", model = "s" }}]

[models."needs-key"]
targets = [{{ upstream = "keyless", model = "k" }}]
{extra}
"""


@pytest.fixture
def make_gateway(
    tmp_path: Path, fake_server: FakeServer
) -> Iterator[Callable[..., GatewayServer]]:
    servers: list[ServerThread] = []

    def make(extra: str = "", policy: str = DEFAULT_POLICY, watch: bool = False,
             embed: Any = None, server: str = "") -> GatewayServer:
        """``server``: TOML lines added to the config's ``[server]``."""
        (tmp_path / "policy.toml").write_text(policy)
        config_path = tmp_path / "gateway.toml"
        config_path.write_text(gateway_toml(fake_server.url, extra).replace(
            "[server]\n", "[server]\n" + server, 1))
        sink = LogSink()
        app = create_app(load_config(config_path), request_sink=sink, watch_policy=watch,
                         embed=embed)
        srv = ServerThread(app).start()
        servers.append(srv)
        return GatewayServer(srv.url, app.gateway, tmp_path / "policy.toml", sink, srv)

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer]) -> GatewayServer:
    return make_gateway()


def wait_until_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0,
                     path: str = "/readyz") -> None:
    """Poll a subprocess's ``path`` (a ``gateway serve``'s /readyz, an engine's /healthz)
    until it answers 200; fails the test if the process exits or ``timeout`` seconds pass
    first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + path).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, f"{url} did not start"
        time.sleep(0.05)


def wait_generation(store: PolicyStore, after: int, timeout: float = 10.0) -> bool:
    """Whether a reload attempt newer than ``after`` (``store.generation`` read before the
    edit) finishes within ``timeout`` seconds. Polls, so any thread may wait."""
    deadline = time.monotonic() + timeout
    while store.generation <= after:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
