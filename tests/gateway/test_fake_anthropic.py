"""The fake Anthropic upstream, driven over loopback by the official ``anthropic`` SDK (and by
raw httpx where the wire itself, or a request the SDK would never send, is the point)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import orjson
import pytest

from gateway.testing.fake_anthropic import ApiError, FakeAnthropic, count_tokens, validate_request
from gateway.testing.server import ServerThread

KEY = "sk-ant-fake"
MODEL = "claude-fake-1"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
HI: list[Any] = [{"role": "user", "content": "hello there"}]
TOOL = {"name": "get_weather", "description": "weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CACHED = {"type": "ephemeral"}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[FakeAnthropic, str]]:
    app = FakeAnthropic(api_key=KEY)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def fake(server: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    server[0].clear()
    return server[0]


@pytest.fixture
def url(server: tuple[FakeAnthropic, str], fake: FakeAnthropic) -> str:
    return server[1]


@pytest.fixture
def client(url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


def test_a_message_carries_the_text_model_and_usage(client: anthropic.Anthropic,
                                                     fake: FakeAnthropic) -> None:
    msg = client.messages.create(model=MODEL, max_tokens=100, messages=HI, system="be brief",
                                 extra_headers={"x-fake-tokens": "3", "x-fake-cache-read": "1"})
    assert msg.id.startswith("msg_") and msg.model == MODEL and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "tok0 tok1 tok2"
    assert (msg.stop_reason, msg.stop_sequence) == ("end_turn", None)
    # 4 prompt words ("hello there", "be brief"), 1 of them read from the cache
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens,
            msg.usage.cache_creation_input_tokens, msg.usage.output_tokens) == (3, 1, 0, 3)
    [rec] = fake.wait_for(lambda records: [r for r in records if r.finished])
    assert rec.path == "/v1/messages" and rec.headers["anthropic-version"]  # the SDK's
    assert rec.json["system"] == "be brief"


def test_max_tokens_cuts_the_text_and_stop_reasons_can_be_steered(
        client: anthropic.Anthropic) -> None:
    cut = client.messages.create(model=MODEL, max_tokens=2, messages=HI,
                                 extra_headers={"x-fake-tokens": "5"})
    assert (cut.content[0].text, cut.stop_reason) == ("tok0 tok1", "max_tokens")
    stopped = client.messages.create(model=MODEL, max_tokens=9, messages=HI,
                                     stop_sequences=["END"],
                                     extra_headers={"x-fake-stop-reason": "stop_sequence"})
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")


def test_a_stream_sends_thinking_then_text_a_word_a_delta(client: anthropic.Anthropic,
                                                          fake: FakeAnthropic) -> None:
    with client.messages.stream(
            model=MODEL, max_tokens=2048, messages=HI,
            thinking={"type": "enabled", "budget_tokens": 1024},
            extra_headers={"x-fake-tokens": "4", "x-fake-thinking": "2",
                           "x-fake-cache-write": "2"}) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces == ["tok0", " tok1", " tok2", " tok3"]
    thinking, text = final.content
    assert thinking.type == "thinking" and thinking.thinking == "think0 think1"
    assert thinking.signature == "sig_fake_2"
    assert text.type == "text" and text.text == "tok0 tok1 tok2 tok3"
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.cache_creation_input_tokens,
            final.usage.output_tokens) == (0, 2, 6)
    assert fake.records[0].json["stream"] is True and fake.records[0].chunks_sent == 4


def test_the_stream_on_the_wire_has_event_lines_in_the_documented_order(url: str) -> None:
    body = {"model": MODEL, "max_tokens": 10, "messages": HI, "stream": True}
    reply = httpx.post(f"{url}/v1/messages", json=body, headers={**HEADERS, "x-fake-tokens": "2"})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["request-id"].startswith("req_")
    frames = [frame.split("\n") for frame in reply.text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in frames]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    assert all(lines[1].startswith(f'data: {{"type":"{name}"') for name, lines in
               zip(names, frames))


def test_a_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "weather in Paris?"}]
    first = client.messages.create(model=MODEL, max_tokens=100, messages=ask, tools=[TOOL],
                                   extra_headers={"x-fake-tool": "1", "x-fake-tokens": "2"})
    call = first.content[-1]
    assert first.stop_reason == "tool_use"
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"x": 1}
    answer = [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]
    second = client.messages.create(
        model=MODEL, max_tokens=100, tools=[TOOL],
        messages=[*ask, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": answer}])
    assert second.stop_reason == "end_turn"


def test_a_streamed_tool_call_arrives_as_json_pieces(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=100, messages=HI, tools=[TOOL],
                                extra_headers={"x-fake-tool": "1"}) as stream:
        final = stream.get_final_message()
    assert final.content[-1].type == "tool_use" and final.content[-1].input == {"x": 1}
    assert final.stop_reason == "tool_use"


@pytest.mark.parametrize(("status", "error", "kind"), [
    (400, anthropic.BadRequestError, "invalid_request_error"),
    (401, anthropic.AuthenticationError, "authentication_error"),
    (403, anthropic.PermissionDeniedError, "permission_error"),
    (429, anthropic.RateLimitError, "rate_limit_error"),
    (500, anthropic.InternalServerError, "api_error"),
    (529, anthropic.OverloadedError, "overloaded_error"),
])
def test_each_error_status_surfaces_as_the_sdks_exception(
        client: anthropic.Anthropic, status: int, error: type[anthropic.APIStatusError],
        kind: str) -> None:
    with pytest.raises(error) as info:
        client.messages.create(model=MODEL, max_tokens=10, messages=HI, extra_headers={
            "x-fake-status": str(status), "x-fake-retry-after": "7"})
    assert info.value.status_code == status
    assert isinstance(info.value.body, dict) and info.value.body["type"] == "error"
    assert info.value.body["error"]["type"] == kind
    assert info.value.response.headers["retry-after"] == "7"
    assert info.value.request_id is not None and info.value.request_id.startswith("req_")


def test_the_sdk_retries_through_fail_times(url: str, fake: FakeAnthropic) -> None:
    steer = {"x-fake-fail-times": "2", "x-fake-key": "retry-1", "x-fake-retry-after": "0.01"}
    with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=2) as sdk:
        msg = sdk.messages.create(model=MODEL, max_tokens=10, messages=HI, extra_headers=steer)
    assert msg.content[0].text.startswith("tok0")
    assert [r.headers["x-stainless-retry-count"] for r in fake.records] == ["0", "1", "2"]


def test_a_wrong_key_is_refused(url: str) -> None:
    with (anthropic.Anthropic(base_url=url, api_key="sk-ant-other", max_retries=0) as sdk,
          pytest.raises(anthropic.AuthenticationError, match="invalid x-api-key")):
        sdk.messages.create(model=MODEL, max_tokens=10, messages=HI)


@pytest.mark.parametrize(("headers", "content", "status", "message"), [
    ({"x-api-key": KEY}, None, 400, "anthropic-version: header is required"),
    ({"anthropic-version": "2023-06-01"}, None, 401, "x-api-key header is required"),
    (HEADERS, b"{not json", 400, "body: Input should be a valid dictionary"),
])
def test_raw_requests_the_sdk_never_sends_are_refused(
        url: str, headers: dict[str, str], content: bytes | None, status: int,
        message: str) -> None:
    body = content or orjson.dumps({"model": MODEL, "max_tokens": 1, "messages": HI})
    reply = httpx.post(f"{url}/v1/messages", content=body, headers=headers)
    assert reply.status_code == status
    assert reply.json()["type"] == "error" and reply.json()["error"]["message"] == message


def test_an_unknown_path_is_a_404_in_anthropic_shape(url: str) -> None:
    reply = httpx.get(f"{url}/v1/models", headers=HEADERS)
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "not_found_error"


def _tool_use(id_: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": "get_weather", "input": {}}


def _result(id_: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id_, "content": "ok"}


REJECTED: list[tuple[dict[str, Any], str]] = [
    ({"extra_body": {"frequency_penalty": 0.5}},
     "frequency_penalty: Extra inputs are not permitted"),
    ({"extra_body": {"temperature": 1.5}}, "temperature: Input should be >= 0 and <= 1"),
    ({"max_tokens": -1}, "max_tokens: Input should be >= 0"),
    ({"messages": []}, "messages: at least one message is required"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role: Input should be"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": " "}]}]},
     "messages.0.content.0.text: text content blocks must contain non-whitespace text"),
    ({"messages": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]},
     "messages.0.content.0: Input tag 'input_text' found using 'type' does not match"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/bmp", "data": "AA=="}}]}]},
     "messages.0.content.0.source.media_type: Input should be"),
    ({"tools": [{**TOOL, "name": "get weather"}]},
     "tools.0.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'"),
    ({"tools": [{"name": "t"}]}, "tools.0.input_schema: Field required"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice: 'tool'"),
    ({"messages": [*HI, {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": [_result("toolu_x")]}]},
     "messages.2: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x"),
    ({"messages": [*HI, {"role": "assistant", "content": [_tool_use("toolu_a")]},
                   {"role": "user", "content": "thanks"}]},
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu"),
    ({"messages": [*HI, {"role": "assistant", "content": [_tool_use("toolu_a")]}, {
        "role": "user", "content": [{"type": "text", "text": "here"}, _result("toolu_a")]}]},
     "messages.2.content: tool_result blocks must come first"),
    ({"messages": [{"role": "user", "content": [_result("toolu_a")]}]}, "unexpected `tool_use_id`"),
    ({"system": [{"type": "text", "text": f"part {i}", "cache_control": CACHED}
                 for i in range(5)]},
     "A maximum of 4 blocks with cache_control may be provided. Found 5."),
    # mid-conversation system messages: placed after a user turn, then last or before an
    # assistant turn
    ({"messages": [{"role": "system", "content": "first"}, *HI]},
     "messages.0: a system message cannot be the first message"),
    ({"messages": [*HI, {"role": "assistant", "content": "ok"},
                   {"role": "system", "content": "late"}]},
     "messages.2: a system message must immediately follow a user message"),
    ({"messages": [*HI, {"role": "system", "content": "a"}, {"role": "system", "content": "b"}]},
     "messages.1: a system message must be the last message or be followed by an assistant"),
    ({"messages": [*HI, {"role": "system", "content": "a"}, *HI]},
     "messages.1: a system message must be the last message or be followed by an assistant"),
    ({"messages": [*HI, {"role": "system", "content": [{"type": "image", "source": {
        "type": "url", "url": "https://x/cat.png"}}]}]},
     "messages.1.content.0: `image` blocks are not allowed here"),
]


@pytest.mark.parametrize(("change", "message"), REJECTED)
def test_strict_validation_names_the_problem(client: anthropic.Anthropic, fake: FakeAnthropic,
                                             change: dict[str, Any], message: str) -> None:
    request: dict[str, Any] = {"model": MODEL, "max_tokens": 10, "messages": HI, **change}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(**request)
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert message in info.value.body["error"]["message"]
    assert len(fake.records) == 1  # what the gateway sent is there to look at


def test_a_rich_valid_request_passes_and_same_role_turns_merge() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}
    body = {
        "model": MODEL, "max_tokens": 2048, "temperature": 0.5, "top_k": 5, "top_p": 0.9,
        "stop_sequences": ["END"], "metadata": {"user_id": "u1"}, "stream": False,
        "cache_control": CACHED, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": [{"type": "text", "text": "be brief", "cache_control": CACHED}],
        "tools": [{**TOOL, "cache_control": CACHED},
                  {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "look", "cache_control": CACHED}, image,
                {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                "data": "a doc"}},
                {"type": "search_result", "source": "s", "title": "t",
                 "content": [{"type": "text", "text": "found"}]}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"}, _tool_use("toolu_a")]},
            {"role": "assistant", "content": [_tool_use("toolu_b")]},  # merges with the above
            {"role": "user", "content": [_result("toolu_a"), {
                "type": "tool_result", "tool_use_id": "toolu_b", "is_error": True,
                "content": [{"type": "text", "text": "failed"}, image]}]},
            {"role": "user", "content": "so?"},
            {"role": "assistant", "content": "The answer is"}]}  # a prefill
    validate_request(body)
    # be brief, look, found, hmm, ok, failed, so?, The answer is, weather of a city
    assert count_tokens(body) == 2 + 1 + 1 + 1 + 1 + 1 + 1 + 3 + 4


@pytest.mark.parametrize(("body", "message"), [
    (None, "body: Input should be a valid dictionary"),
    ({"model": MODEL, "messages": HI}, "max_tokens: Field required"),
    ({"model": 3, "max_tokens": 1, "messages": HI}, "model: Input should be a valid string"),
    ({"model": MODEL, "max_tokens": True, "messages": HI},
     "max_tokens: Input should be a valid integer"),
])
def test_validate_request_can_be_called_directly(body: Any, message: str) -> None:
    with pytest.raises(ApiError, match=message) as info:
        validate_request(body)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"


def test_mid_conversation_system_messages_are_taken_where_anthropic_takes_them(
        client: anthropic.Anthropic, fake: FakeAnthropic) -> None:
    search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
              "input": {"query": "x"}}
    for messages in (
            [*HI, {"role": "system", "content": "Plan mode is on."}],
            [*HI, {"role": "system", "content": [{"type": "text", "text": "Terse.",
                                                   "cache_control": CACHED}]},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}],
            [*HI, {"role": "assistant", "content": [search]},
             {"role": "system", "content": "after a server tool"}]):
        message = client.messages.create(
            model=MODEL, max_tokens=10, messages=messages,
            extra_body={"context_management": {"edits": []}},  # under its beta, too
            extra_headers={"anthropic-beta": "mid-conversation-system-2026-04-07"})
        assert message.stop_reason == "end_turn"
    assert len(fake.records) == 3


def test_a_model_without_system_messages_refuses_them_in_anthropics_words(
        client: anthropic.Anthropic) -> None:
    messages: Any = [*HI, {"role": "system", "content": "Plan mode is on."}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=10, messages=messages,
                               extra_headers={"x-fake-no-system-role": "1"})
    assert "messages.1.role: role 'system' is not supported on this model" in str(info.value)
    client.messages.create(model=MODEL, max_tokens=10, messages=HI,  # none: answered
                           extra_headers={"x-fake-no-system-role": "1"})


def test_count_tokens_answers_the_prompt_size(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL, messages=HI, system="be brief")
    assert counted.input_tokens == 4
    with pytest.raises(anthropic.BadRequestError, match="max_tokens: Extra inputs"):
        client.messages.count_tokens(model=MODEL, messages=HI, extra_body={"max_tokens": 5})


def test_an_error_midway_ends_the_stream_with_an_error_event(client: anthropic.Anthropic) -> None:
    pieces: list[str] = []
    steer = {"x-fake-tokens": "5", "x-fake-error-midway": "2"}
    with (pytest.raises(anthropic.APIStatusError) as info,
          client.messages.stream(model=MODEL, max_tokens=100, messages=HI,
                                 extra_headers=steer) as stream):
        pieces.extend(stream.text_stream)
    assert pieces == ["tok0", " tok1"]
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "overloaded_error"


def test_die_after_drops_the_connection_mid_stream(client: anthropic.Anthropic,
                                                   fake: FakeAnthropic) -> None:
    pieces: list[str] = []
    steer = {"x-fake-tokens": "5", "x-fake-die-after": "3"}
    with (pytest.raises(httpx2.RemoteProtocolError),  # the SDK's transport error, unwrapped
          client.messages.stream(model=MODEL, max_tokens=100, messages=HI,
                                 extra_headers=steer) as stream):
        pieces.extend(stream.text_stream)
    assert pieces == ["tok0", " tok1", " tok2"]
    assert fake.records[0].chunks_sent == 3


def test_the_fake_sees_the_client_go_away(client: anthropic.Anthropic,
                                          fake: FakeAnthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=100, messages=HI, extra_headers={
            "x-fake-tokens": "100", "x-fake-itl-ms": "20"}) as stream:
        for _ in zip(range(2), stream.text_stream):
            pass
    [rec] = fake.wait_for(lambda records: [r for r in records if r.disconnected and r.finished])
    assert rec.chunks_sent < 100


def test_ttft_delays_the_first_byte(client: anthropic.Anthropic, fake: FakeAnthropic) -> None:
    client.messages.create(model=MODEL, max_tokens=10, messages=HI,
                           extra_headers={"x-fake-ttft-ms": "60"})
    rec = fake.records[0]
    assert rec.first_byte is not None and rec.first_byte - rec.arrived >= 0.06
