"""Fixtures the Bedrock test modules share (test_bedrock, test_bedrock_converse): the fake
Bedrock, one per module, its records cleared for each test, and ``sdk``: the SDK clients
of a gateway in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.testing.fake_bedrock import FakeBedrock
from gateway.testing.server import ServerThread
from tests.conftest import GatewayServer
from tests.gateway.providers.bedrock_env import Clients, aws_env, bedrock_toml


@pytest.fixture(scope="module")
def bedrock_server() -> Iterator[tuple[FakeBedrock, str]]:
    app = FakeBedrock(simulate_cache=True)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def bedrock(bedrock_server: tuple[FakeBedrock, str]) -> FakeBedrock:
    bedrock_server[0].clear()
    return bedrock_server[0]


@pytest.fixture
def sdk(make_gateway: Callable[..., GatewayServer], bedrock_server: tuple[FakeBedrock, str],
        bedrock: FakeBedrock, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> Iterator[Clients]:
    """The SDK clients of a gateway on the fake Bedrock, its key in the environment."""
    aws_env(monkeypatch, bedrock, tmp_path)
    clients = Clients(make_gateway(bedrock_toml(bedrock_server[1])))
    yield clients
    clients.close()
