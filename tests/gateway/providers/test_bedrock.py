"""Claude on Amazon Bedrock through InvokeModel (``type = "bedrock"``, ``api = "invoke"``):
the official anthropic and openai SDKs through a real gateway to the fake Bedrock, which
checks each request's SigV4 signature with botocore and its body as Bedrock does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from gateway.testing.fake_bedrock import BAD_SIGNATURE, FakeBedrock
from tests.conftest import GatewayServer
from tests.gateway.providers.bedrock_env import CLAUDE_ID, RULES, Clients, aws_env, bedrock_toml

INVOKE = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
#: A system prompt long enough to cache (about 2,000 tokens).


HELLO = [{"role": "user", "content": "Hello"}]


def test_an_anthropic_client_reaches_claude_on_bedrock_signed_with_the_model_in_the_url(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    message = sdk.claude().messages.create(model="claude-bedrock", max_tokens=64,
                                         messages=HELLO)
    assert message.content[0].text == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    (rec,) = bedrock.records
    assert rec.path == INVOKE  # the profile id, ":" encoded
    assert rec.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAFAKE")
    assert rec.json["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in rec.json and "stream" not in rec.json
    assert "anthropic-version" not in rec.headers and "x-api-key" not in rec.headers


def test_a_stream_comes_back_as_anthropic_events_from_the_event_stream_frames(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    with sdk.claude().messages.stream(model="claude-bedrock", max_tokens=64,
                                    messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 8
    assert bedrock.records[0].path.endswith("/invoke-with-response-stream")


def test_client_betas_become_the_body_list(sdk: Clients, bedrock: FakeBedrock) -> None:
    sdk.claude(**{"anthropic-beta": "a-2025, b-2025"}).messages.create(
        model="claude-bedrock", max_tokens=8, messages=HELLO,
        metadata={"user_id": "u1"})
    body = bedrock.records[0].json
    assert body["anthropic_beta"] == ["a-2025", "b-2025"] and "metadata" not in body


def test_an_openai_client_chats_and_streams_through_the_anthropic_bridge(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    reply = sdk.gpt().chat.completions.create(model="claude-bedrock", messages=HELLO)
    assert reply.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    chunks = list(sdk.gpt().chat.completions.create(model="claude-bedrock", messages=HELLO,
                                                  stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) \
        == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    assert bedrock.records[1].json["max_tokens"] == 4096  # the policy's default


def test_a_responses_client_gets_its_answer_whole_and_streamed_from_invoke_model(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    response = sdk.gpt().responses.create(model="claude-bedrock", input="Hello",
                                          instructions="Be brief.")
    assert response.status == "completed"
    assert response.output_text == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    assert response.usage is not None and response.usage.output_tokens == 8
    events = list(sdk.gpt().responses.create(model="claude-bedrock", input="Hello",
                                             stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.completed"
    assert text == events[-1].response.output_text == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    whole, streamed = bedrock.records
    assert whole.path == INVOKE and whole.json["system"] == "Be brief."
    assert streamed.path.endswith("/invoke-with-response-stream")
    assert streamed.json["anthropic_version"] == "bedrock-2023-05-31"


def test_tools_and_structured_output_from_an_openai_client(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "x": {"type": "integer"}}}}}]
    reply = sdk.gpt(**{"x-fake-tool": "1"}).chat.completions.create(
        model="claude-bedrock", messages=HELLO, tools=tools)
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"x": 1}
    assert reply.choices[0].finish_reason == "tool_calls"
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    answer = sdk.gpt().chat.completions.create(
        model="claude-bedrock", messages=HELLO, response_format={
            "type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    assert set(json.loads(answer.choices[0].message.content or "")) == {"city"}


def test_a_long_conversation_is_read_from_bedrocks_prompt_cache(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    """The prompt_cache stage places cache_control breakpoints as for Anthropic: the
    second turn reads the first's prefix (the fake simulates Claude's cache)."""
    messages = [{"role": "system", "content": RULES}, {"role": "user", "content": "Hello"}]
    first = sdk.gpt().chat.completions.create(model="claude-bedrock", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And then?"}]
    second = sdk.gpt().chat.completions.create(model="claude-bedrock", messages=messages)
    assert "cache_control" in json.dumps(bedrock.records[0].json["system"])
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens and details.cached_tokens > 1000
    # and an Anthropic client's own breakpoint, as it came
    system = [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}]
    again = sdk.claude().messages.create(model="claude-bedrock", max_tokens=8, system=system,
                                       messages=HELLO)
    assert (again.usage.cache_read_input_tokens or 0) + \
        (again.usage.cache_creation_input_tokens or 0) > 1000


def test_throttling_is_retried_then_answered_in_each_clients_format(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    ok = sdk.claude(**{"x-fake-fail-times": "1", "x-fake-key": "t1"}).messages.create(
        model="claude-bedrock", max_tokens=8, messages=HELLO)
    assert ok.content and len(bedrock.records) == 2  # a ThrottlingException, then the answer
    with pytest.raises(anthropic.RateLimitError) as caught:
        sdk.claude(**{"x-fake-status": "429"}).messages.create(
            model="claude-bedrock", max_tokens=8, messages=HELLO)
    assert caught.value.body["error"]["type"] == "rate_limit_error"
    assert "Too many requests" in caught.value.message
    with pytest.raises(openai.RateLimitError):
        sdk.gpt(**{"x-fake-status": "429"}).chat.completions.create(
            model="claude-bedrock", messages=HELLO)


@pytest.mark.parametrize(("status", "name", "expected"), [
    (400, "ValidationException", anthropic.BadRequestError),
    (403, "AccessDeniedException", anthropic.PermissionDeniedError),
    (503, "ServiceUnavailableException", anthropic.InternalServerError),
])
def test_bedrock_errors_reach_the_client_with_their_status(
        sdk: Clients, status: int, name: str, expected: type[Exception]) -> None:
    with pytest.raises(expected) as caught:
        sdk.claude(**{"x-fake-status": str(status), "x-fake-error-type": name}
               ).messages.create(model="claude-bedrock", max_tokens=8, messages=HELLO)
    assert caught.value.status_code == status


def test_an_exception_frame_in_the_stream_is_retried_then_an_error_event(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    with httpx.stream("POST", sdk.gw.url + "/v1/messages", json={
            "model": "claude-bedrock", "max_tokens": 8, "stream": True, "messages": HELLO},
            headers={"x-fake-stream-exception": "throttlingException"}) as response:
        body = response.read().decode()
    assert len(bedrock.records) == 3  # the policy's max_attempts
    assert "event: error" in body and '"rate_limit_error"' in body
    with httpx.stream("POST", sdk.gw.url + "/v1/messages", json={
            "model": "claude-bedrock", "max_tokens": 8, "stream": True, "messages": HELLO},
            headers={"x-fake-error-midway": "2"}) as response:
        body = response.read().decode()
    assert "tok1" in body and body.rstrip().endswith("}") and '"api_error"' in body


def test_a_wrong_secret_is_refused_by_the_fake_as_bedrock_would(
        make_gateway: Callable[..., GatewayServer], bedrock_server: tuple[FakeBedrock, str],
        bedrock: FakeBedrock, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    aws_env(monkeypatch, bedrock, tmp_path, secret="not-the-secret")
    sdk = Clients(make_gateway(bedrock_toml(bedrock_server[1])))
    try:
        with pytest.raises(anthropic.APIStatusError) as caught:
            sdk.claude().messages.create(model="claude-bedrock", max_tokens=8, messages=HELLO)
        assert caught.value.status_code == 403
        assert caught.value.body["error"]["message"] == BAD_SIGNATURE
        with pytest.raises(openai.PermissionDeniedError):
            sdk.gpt().chat.completions.create(model="claude-bedrock", messages=HELLO)
    finally:
        sdk.close()
    assert {r.path for r in bedrock.records} == {INVOKE}  # it reached the fake, refused


def test_count_tokens_asks_bedrocks_count_tokens(sdk: Clients,
                                                 bedrock: FakeBedrock) -> None:
    counted = sdk.claude().messages.count_tokens(model="claude-bedrock",
                                               messages=HELLO)
    assert counted.input_tokens == 1
    (rec,) = bedrock.records
    assert rec.path == f"/model/{CLAUDE_ID.replace(':', '%3A')}/count-tokens"
    assert json.loads(rec.json["input"]["invokeModel"]["body"])["messages"] == HELLO
