"""Any model on Amazon Bedrock through Converse (``type = "bedrock"``, ``api =
"converse"``): the official openai and anthropic SDKs, and a Responses client, through a
real gateway to the fake Bedrock (SigV4 checked, Converse's shapes checked)."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from gateway.testing.fake_bedrock import FakeBedrock
from tests.gateway.providers.bedrock_env import RULES, Clients

HELLO = [{"role": "user", "content": "Hello"}]
WORDS = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather.",
    "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]


def test_an_openai_client_chats_with_nova_through_converse(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    reply = sdk.gpt().chat.completions.create(model="nova", messages=[
        {"role": "system", "content": "Be brief."}, *HELLO], max_tokens=50, temperature=0.5)
    assert reply.choices[0].message.content == WORDS
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    (rec,) = bedrock.records
    assert rec.path == "/model/amazon.nova-pro-v1%3A0/converse"
    assert rec.json["system"] == [{"text": "Be brief."}]
    assert rec.json["messages"] == [{"role": "user", "content": [{"text": "Hello"}]}]
    assert rec.json["inferenceConfig"] == {"maxTokens": 50, "temperature": 0.5}


def test_streams_from_each_client_api(sdk: Clients, bedrock: FakeBedrock) -> None:
    chunks = list(sdk.gpt().chat.completions.create(model="nova", messages=HELLO, stream=True,
                                                  stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == WORDS
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    with sdk.claude().messages.stream(model="nova", max_tokens=64, messages=HELLO) as stream:
        assert "".join(stream.text_stream) == WORDS
        assert stream.get_final_message().stop_reason == "end_turn"
    assert bedrock.records[0].path.endswith("/converse-stream")
    events = sdk.gpt().responses.create(model="nova", input="Hello", stream=True)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == WORDS


def test_tools_round_trip_from_openai_and_anthropic_clients(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    reply = sdk.gpt(**{"x-fake-tool": "1"}).chat.completions.create(
        model="nova", messages=HELLO, tools=TOOLS, tool_choice="required")
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"x": 1}
    assert bedrock.records[0].json["toolConfig"]["toolChoice"] == {"any": {}}
    follow = [*HELLO, reply.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    after = sdk.gpt().chat.completions.create(model="nova", messages=follow, tools=TOOLS)
    assert after.choices[0].message.content == WORDS
    sent = bedrock.records[1].json["messages"]
    assert sent[1]["content"][-1]["toolUse"]["name"] == "get_weather"  # after its text
    assert sent[2]["content"][0]["toolResult"]["content"] == [{"text": "sunny"}]
    with sdk.claude(**{"x-fake-tool": "1"}).messages.stream(
            model="nova", max_tokens=64, messages=HELLO, tools=[{
                "name": "get_weather", "input_schema": {"type": "object"}}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"x": 1}


def test_structured_output_is_a_forced_tool_given_back_as_text(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    answer = sdk.gpt().chat.completions.create(model="nova", messages=HELLO, response_format=fmt)
    assert json.loads(answer.choices[0].message.content or "") == {"city": ""}
    assert answer.choices[0].finish_reason == "stop"
    streamed = sdk.gpt().chat.completions.create(model="nova", messages=HELLO,
                                               response_format=fmt, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert json.loads(text) == {"city": ""}


def test_a_conversation_reads_bedrocks_cache_through_cache_points(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    messages = [{"role": "system", "content": RULES}, *HELLO]
    first = sdk.gpt().chat.completions.create(model="claude-converse", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And then?"}]
    second = sdk.gpt().chat.completions.create(model="claude-converse", messages=messages)
    assert {"cachePoint": {"type": "default"}} in bedrock.records[0].json["system"]
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens and details.cached_tokens > 1000
    # an Anthropic client's own cache_control becomes a cachePoint after its block
    system = [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}]
    again = sdk.claude().messages.create(model="claude-converse", max_tokens=8, system=system,
                                       messages=HELLO)
    assert (again.usage.cache_read_input_tokens or 0) > 1000


def test_throttling_and_errors_in_the_callers_format(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    with pytest.raises(openai.RateLimitError):
        sdk.gpt(**{"x-fake-status": "429"}).chat.completions.create(model="nova",
                                                                    messages=HELLO)
    assert len(bedrock.records) == 3  # retried as a 429
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.claude(**{"x-fake-status": "400"}).messages.create(model="nova", max_tokens=8,
                                                               messages=HELLO)
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    with httpx.stream("POST", sdk.gw.v1 + "/chat/completions", json={
            "model": "nova", "stream": True, "messages": HELLO},
            headers={"x-fake-error-midway": "2"}) as response:
        body = response.read().decode()
    assert "tok1" in body and '"error"' in body and "[DONE]" not in body


def test_what_converse_cannot_take_is_a_400_naming_it(sdk: Clients,
                                                      bedrock: FakeBedrock) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.claude().messages.create(model="nova", max_tokens=8, messages=HELLO, tools=[
            {"type": "web_search_20250305", "name": "web_search"}])
    assert "web_search" in caught.value.message and "Converse" in caught.value.message
    assert bedrock.records == []


def test_a_tool_history_without_its_tools_is_a_400_before_sending(
        sdk: Clients, bedrock: FakeBedrock) -> None:
    """Converse refuses tool blocks without a toolConfig; the gateway says so itself rather
    than declaring placeholder tools the model could call."""
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": [
                   {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.claude().messages.create(model="nova", max_tokens=8, messages=history)
    assert "without tools" in caught.value.message and "Converse" in caught.value.message
    assert bedrock.records == []
