"""Anthropic Messages requests as real clients send them, accepted as Anthropic accepts them:
Claude Code's, with its default model (system-role messages inside ``messages`` under the
``mid-conversation-system-2026-04-07`` beta, ``context_management``, adaptive thinking, its
betas), through the gateway with every stage of the default policy, to an Anthropic upstream
(the body and the versioning headers as they came) and to an OpenAI-compatible one (the
system message in place); where a model refuses such a message, the words Claude Code
recovers on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer
from tests.gateway.formats.claude_code import MID_CONVERSATION_BETA, folds_system_messages

KEY_ENV = "GATEWAY_TEST_AS_SENT_KEY"
#: The betas Claude Code 2.1.197 sends with its default model (its cli.js).
BETAS = ("claude-code-20250219,interleaved-thinking-2025-05-14,"
         f"context-management-2025-06-27,{MID_CONVERSATION_BETA}")
HEADERS = {"x-api-key": "sk-client", "anthropic-version": "2023-06-01",
           "anthropic-beta": BETAS, "content-type": "application/json"}
BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}
CACHED = {"type": "ephemeral"}


def claude_code(model: str = "claude", **fields: Any) -> dict[str, Any]:
    """A request shaped as Claude Code's: its system prompt's blocks, a user turn of
    reminder and prompt, then a system-role message (what its mid-conversation-system beta
    carries: plan mode, reminders), and the fields it sets by default."""
    return {
        "model": model, "max_tokens": 32000,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197"},
                   {"type": "text", "text": "You are Claude Code.", "cache_control": CACHED}],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>Today is Monday.</system-reminder>"},
                {"type": "text", "text": "Fix the failing test", "cache_control": CACHED}]},
            {"role": "system", "content": "Plan mode is on: do not edit files yet."}],
        "tools": [BASH], "metadata": {"user_id": '{"device_id":"d1","session_id":"s1"}'},
        "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        **fields}


@pytest.fixture
def gateway(make_gateway: Callable[..., GatewayServer],
            claude_server: tuple[FakeAnthropic, str],
            monkeypatch: pytest.MonkeyPatch) -> Callable[..., GatewayServer]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-upstream")
    claude_server[0].clear()

    def build(policy: str = DEFAULT_POLICY) -> GatewayServer:
        return make_gateway(f"""
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "{claude_server[1]}"
api_key_env = "{KEY_ENV}"
beta = ["configured-beta-2025-01-01"]

[models.claude]
targets = [{{ upstream = "claude", model = "claude-upstream" }}]

[models."claude-on-gpt"]
targets = [{{ upstream = "fake", model = "gpt-upstream" }}]
""", policy=policy)
    return build


def post(gw: GatewayServer, body: dict[str, Any] | bytes, **headers: str) -> httpx.Response:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(gw.url + "/v1/messages", content=raw, headers={**HEADERS, **headers})


def test_claude_codes_request_reaches_anthropic_byte_for_byte_with_its_betas(
        gateway: Callable[..., GatewayServer], claude_server: tuple[FakeAnthropic, str]):
    # With the prompt_cache stage off (it may add markers and reorder: the contract's
    # allowed changes), the request goes through as it came, but for the model.
    gw = gateway(DEFAULT_POLICY + "\n[prompt_cache]\nenabled = false\n")
    raw = orjson.dumps(claude_code(unknown_new_field={"kept": [1, 2]}))
    reply = httpx.post(gw.url + "/v1/messages", content=raw, headers=[
        *HEADERS.items(), ("anthropic-beta", "a-second-line-2026-01-01")])
    # the fake refuses what Anthropic refuses, a field it does not know among it: its 400,
    # as it came, proves the gateway sent the field on
    assert reply.status_code == 400
    assert "unknown_new_field: Extra inputs are not permitted" in reply.json()["error"]["message"]
    raw = orjson.dumps(claude_code())
    reply = post(gw, raw)
    assert reply.status_code == 200, reply.text
    seen = claude_server[0].records[-1]
    assert seen.body == raw.replace(b'"model":"claude"', b'"model":"claude-upstream"')
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["anthropic-beta"] == "configured-beta-2025-01-01," + BETAS
    first = claude_server[0].records[0]  # two anthropic-beta lines: both, each once
    assert first.headers["anthropic-beta"] == ("configured-beta-2025-01-01," + BETAS
                                               + ",a-second-line-2026-01-01")


@pytest.mark.parametrize("stream", [False, True])
def test_claude_codes_request_is_answered_through_every_default_stage(
        gateway: Callable[..., GatewayServer], claude_server: tuple[FakeAnthropic, str],
        stream: bool):
    gw = gateway()
    body = claude_code()
    newer = ("thinking", "output_config", "context_management")  # past this SDK's types
    kwargs: Any = {**{k: v for k, v in body.items() if k not in newer}, "max_tokens": 8000,
                   "extra_body": {k: body[k] for k in newer}, "betas": BETAS.split(",")}
    # As Claude Code calls it: the SDK's beta namespace (POST /v1/messages?beta=true)
    with anthropic.Anthropic(base_url=gw.url, api_key="sk-client", max_retries=0) as client:
        if stream:
            with client.beta.messages.stream(**kwargs) as events:
                message = events.get_final_message()
        else:
            message = client.beta.messages.create(**kwargs)
    assert message.stop_reason == "end_turn" and message.content[0].type == "text"
    seen = claude_server[0].records[-1].json
    assert seen["messages"][-1] == {"role": "system",
                                    "content": "Plan mode is on: do not edit files yet."}
    assert seen["context_management"] == body["context_management"]
    assert seen["thinking"] == {"type": "adaptive"}
    assert claude_server[0].records[-1].headers["anthropic-beta"].endswith(BETAS)
    assert gw.logged()[0]["status"] == 200


def test_a_model_that_refuses_system_messages_answers_in_its_own_words(
        gateway: Callable[..., GatewayServer]):
    reply = post(gateway(), claude_code(), **{"x-fake-no-system-role": "1"})
    assert reply.status_code == 400
    assert reply.json()["error"] == {
        "type": "invalid_request_error",
        "message": "messages.1.role: role 'system' is not supported on this model"}
    assert folds_system_messages(reply.status_code, reply.content)


def test_claude_codes_request_to_an_openai_model_keeps_the_system_message_in_place(
        gateway: Callable[..., GatewayServer], fake: FakeUpstream):
    gw = gateway()
    reply = post(gw, claude_code("claude-on-gpt"))
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"][0]["type"] == "text"
    sent = fake.records[-1].json
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "system"]
    assert sent["messages"][-1] == {"role": "system",
                                    "content": "Plan mode is on: do not edit files yet."}
    # how much to think and how to trim the context have no OpenAI equivalent: dropped
    assert not {"thinking", "context_management", "output_config"} & set(sent)
    assert sent["model"] == "gpt-upstream" and sent["tools"][0]["function"]["name"] == "Bash"


def test_claude_codes_count_tokens_goes_to_anthropic_as_it_came_and_is_estimated_elsewhere(
        gateway: Callable[..., GatewayServer], claude_server: tuple[FakeAnthropic, str]):
    gw = gateway()
    body = {k: v for k, v in claude_code().items() if k not in ("max_tokens", "metadata")}
    raw = orjson.dumps(body)
    counted = httpx.post(gw.url + "/v1/messages/count_tokens", content=raw, headers=HEADERS)
    assert counted.status_code == 200, counted.text
    seen = claude_server[0].records[-1]
    assert seen.body == raw.replace(b'"model":"claude"', b'"model":"claude-upstream"')
    assert seen.headers["anthropic-beta"] == "configured-beta-2025-01-01," + BETAS
    estimated = httpx.post(gw.url + "/v1/messages/count_tokens", headers=HEADERS,
                           content=orjson.dumps({**body, "model": "claude-on-gpt"}))
    assert estimated.status_code == 200 and estimated.json()["input_tokens"] > 20
    assert estimated.headers["x-gateway-token-count"] == "estimate"


def test_a_translated_upstream_error_is_logged_with_the_type_the_client_read(
        gateway: Callable[..., GatewayServer], fake: FakeUpstream):
    gw = gateway()
    reply = post(gw, claude_code("claude-on-gpt"), **{"x-fake-status": "400"})
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    [line] = gw.logged(1)
    assert (line["status"], line["error_type"]) == (400, "invalid_request_error")
