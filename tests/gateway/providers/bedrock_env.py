"""Shared by the Bedrock tests: the fake's credentials in the environment botocore reads,
and a gateway config with an InvokeModel and a Converse upstream on the fake."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import openai
import pytest

from gateway.testing.fake_bedrock import FakeBedrock
from tests.conftest import GatewayServer

CLAUDE_ID = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"  # a cross-region inference profile
NOVA_ID = "amazon.nova-pro-v1:0"
#: A system prompt long enough to cache (about 2,000 tokens).
RULES = "\n".join(f"Rule {i}: help the traveller with booking change number {i}, politely "
                  "and in full sentences, checking the fare rules first." for i in range(100))


def aws_env(monkeypatch: pytest.MonkeyPatch, fake: FakeBedrock, tmp: Path,
            secret: str | None = None) -> None:
    """The fake's key in the environment (``secret``: another one), nothing else for
    botocore's chain to find (no files, no instance metadata)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", fake.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret or fake.secret_key)
    monkeypatch.setenv("AWS_REGION", fake.region)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def bedrock_toml(url: str) -> str:
    return f"""
[upstreams.bedrock]
type = "bedrock"
base_url = "{url}"
forward_headers = ["x-fake-*"]

[upstreams.bedrock-converse]
type = "bedrock"
base_url = "{url}"
forward_headers = ["x-fake-*"]
bedrock = {{ api = "converse" }}

[models.claude-bedrock]
targets = [{{ upstream = "bedrock", model = "{CLAUDE_ID}" }}]

[models.nova]
targets = [{{ upstream = "bedrock-converse", model = "{NOVA_ID}" }}]

[models.claude-converse]
targets = [{{ upstream = "bedrock-converse", model = "{CLAUDE_ID}" }}]
"""


@dataclass
class Clients:
    """The official SDKs' clients on a gateway (retries off), closed by :meth:`close`."""

    gw: GatewayServer
    opened: list[openai.OpenAI | anthropic.Anthropic] = field(default_factory=list)

    def gpt(self, **headers: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.gw.v1, api_key="x", max_retries=0,
                               default_headers=headers)
        self.opened.append(client)
        return client

    def claude(self, **headers: str) -> anthropic.Anthropic:
        client = anthropic.Anthropic(base_url=self.gw.url, api_key="x", max_retries=0,
                                     default_headers=headers)
        self.opened.append(client)
        return client

    def close(self) -> None:
        for client in self.opened:
            client.close()
