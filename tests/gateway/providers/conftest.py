"""Fixtures the Bedrock test modules share (test_bedrock, test_bedrock_converse): the fake
Bedrock, one per module, its records cleared for each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.testing.fake_bedrock import FakeBedrock
from gateway.testing.server import ServerThread


@pytest.fixture(scope="module")
def bedrock_server() -> Iterator[tuple[FakeBedrock, str]]:
    app = FakeBedrock(simulate_cache=True)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def bedrock(bedrock_server: tuple[FakeBedrock, str]) -> FakeBedrock:
    bedrock_server[0].clear()
    return bedrock_server[0]
