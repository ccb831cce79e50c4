"""Fixtures shared by the gateway's test modules."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from tests.conftest import GatewayServer

ANTHROPIC_KEY_ENV = "GATEWAY_TEST_RESPONSES_ANTHROPIC_KEY"


@pytest.fixture
def with_claude(make_gateway: Callable[..., GatewayServer],
                claude_server: tuple[FakeAnthropic, str],
                monkeypatch: pytest.MonkeyPatch) -> tuple[GatewayServer, FakeAnthropic]:
    monkeypatch.setenv(ANTHROPIC_KEY_ENV, "sk-ant-upstream")
    app, url = claude_server
    app.clear()
    gw = make_gateway(f"""
[upstreams.claude]
type = "anthropic"
base_url = "{url}"
api_key_env = "{ANTHROPIC_KEY_ENV}"

[models.claude]
targets = [{{ upstream = "claude", model = "claude-upstream" }}]
""")
    return gw, app
