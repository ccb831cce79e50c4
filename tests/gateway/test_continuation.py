"""Issue 48, item 3, as clients see it over real HTTP: a stream that breaks, stalls or sends
an error event once answering is continued where its target can continue the very text it
was given (the fakes continue a final assistant message deterministically), and the
client's stream reads as one answer equal to an uninterrupted run's; where it cannot (a
model not marked, a tool call cut), the stream ends with the protocol's error event."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import orjson
import pytest

from gateway.stream_watch_policy import PREFILL_MODELS
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import GatewayServer
from tests.gateway.test_stream_watch import chat_text, metric, policy, sse, upstreams

CHAT = {"model": "watched", "stream": True, "messages": [{"role": "user", "content": "hi"}],
        "stream_options": {"include_usage": True}}
WORDS = "w0 w1 w2 w3 w4 w5 w6 w7"
CONTINUE = 'continue_upstreams = ["slow", "quick"]'
MESSAGES = {"model": "watched", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
AV = {"anthropic-version": "2023-06-01"}
TOKS = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"


def gateway(make: Callable[..., GatewayServer], url: str, slow: str, watch: str = CONTINUE,
            kind: str = "openai") -> GatewayServer:
    return make(upstreams(url, slow, kind), policy=policy(watch))


def chunks(events: list[tuple[str | None, str]]) -> list[dict[str, Any]]:
    return [orjson.loads(d) for n, d in events if n is None and d != "[DONE]"]


def test_a_cut_chat_stream_is_continued_and_reads_as_one_answer(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = gateway(make_gateway, fake_server.url, '"x-fake-die-after" = "3"')
    events = sse(gw.v1 + "/chat/completions", CHAT)
    assert chat_text(events) == WORDS and events[-1][1] == "[DONE]"
    got = chunks(events)
    assert sum(1 for c in got for ch in c["choices"] if "role" in ch["delta"]) == 1
    assert sum(1 for c in got for ch in c["choices"] if ch["finish_reason"]) == 1
    assert len({c["id"] for c in got}) == 1  # one answer's chunks
    usage = got[-1]["usage"]
    assert usage["completion_tokens"] == 8  # 3 before the cut, 5 after
    resent = next(r for r in fake.records if r.path.startswith("/quick")).json
    assert resent["continue_final_message"] is True and resent["add_generation_prompt"] is False
    assert resent["messages"][-1] == {"role": "assistant", "content": "w0 w1 w2 "}
    assert usage["prompt_tokens"] > 11  # the continuation's own (user + assistant) and more
    log = gw.logged()[0]
    assert log["continued"] == 1 and log["status"] == 200 and log["error_type"] is None
    assert log["completion_tokens"] == 8 and log["upstream"] == "quick"
    assert metric(gw, 'gateway_stream_continuations_total{upstream="slow"}') == 1
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="watched", messages=[{"role": "user", "content": "hi"}], stream=True)
            if c.choices)
    assert text == WORDS


def test_a_stalled_chat_stream_is_continued(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = gateway(make_gateway, fake_server.url,
                 '"x-fake-stall-after" = "2", "x-fake-ping-ms" = "20"',
                 CONTINUE + "\nstream_idle_timeout_ms = 150")
    events = sse(gw.v1 + "/chat/completions", CHAT)
    assert chat_text(events) == WORDS and events[-1][1] == "[DONE]"
    log = gw.logged()[0]
    assert log["stalled"] == "idle" and log["continued"] == 1 and log["error_type"] is None


def test_an_anthropic_stream_with_an_error_event_is_continued_from_a_prefill(
        make_gateway: Callable[..., GatewayServer],
        claude_upstream: tuple[FakeAnthropic, str]) -> None:
    app, url = claude_upstream
    gw = make_gateway(upstreams(url, '"x-fake-error-midway" = "3"', "anthropic").replace(
        'model = "m"', 'model = "claude-sonnet-4-5"'), policy=policy(""))
    events = sse(gw.url + "/v1/messages", MESSAGES, AV)
    names = [n for n, _ in events]
    assert names.count("message_start") == 1 and names[-1] == "message_stop"
    assert "error" not in names and names.count("content_block_start") == 1
    text = "".join(orjson.loads(d)["delta"]["text"] for n, d in events
                   if n == "content_block_delta")
    assert text == TOKS
    delta = next(orjson.loads(d) for n, d in events if n == "message_delta")
    assert delta["usage"]["output_tokens"] == 8  # 3 + 5
    resent = next(r for r in app.records if r.json and r.json["messages"][-1]["role"]
              == "assistant").json
    assert resent["messages"][-1]["content"] == "tok0 tok1 tok2"
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client, \
            client.messages.stream(**{k: v for k, v in MESSAGES.items()  # type: ignore[arg-type]
                                      if k != "stream"}) as stream:
        assert stream.get_final_text() == TOKS
    assert [r["continued"] for r in gw.logged(2)] == [1, 1]


def test_a_responses_client_reads_one_continued_answer(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = gateway(make_gateway, fake_server.url, '"x-fake-die-after" = "3"')
    events = sse(gw.v1 + "/responses", {"model": "watched", "input": "hi", "stream": True})
    names = [n for n, _ in events]
    assert names.count("response.created") == 1 and names[-1] == "response.completed"
    done = orjson.loads(events[-1][1])["response"]
    assert done["usage"]["output_tokens"] == 8
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client, \
            client.responses.stream(model="watched", input="hi") as stream:
        assert stream.get_final_response().output_text == WORDS
    assert [r["continued"] for r in gw.logged(2)] == [1, 1]


def test_a_stream_cut_in_a_tool_call_ends_with_an_error_event(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = gateway(make_gateway, fake_server.url,
                 '"x-fake-tool" = "1", "x-fake-stall-after" = "1", "x-fake-ping-ms" = "20"',
                 CONTINUE + "\nstream_idle_timeout_ms = 150")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    events = sse(gw.v1 + "/chat/completions", {**CHAT, "tools": tools})
    assert "error" in orjson.loads(events[-1][1])
    assert "[DONE]" not in {d for _, d in events}
    assert gw.logged()[0]["continued"] == 0
    assert not [r for r in fake.records if r.path.startswith("/quick")]


def test_a_model_not_marked_continuable_ends_with_an_error_event(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = gateway(make_gateway, fake_server.url, '"x-fake-die-after" = "3"', "")
    events = sse(gw.v1 + "/chat/completions", CHAT)
    assert chat_text(events[:-1]) == "w0 w1 w2 " and "error" in orjson.loads(events[-1][1])
    assert gw.logged()[0]["continued"] == 0


def test_an_anthropic_model_that_refuses_prefill_ends_with_an_error_event(
        make_gateway: Callable[..., GatewayServer],
        claude_upstream: tuple[FakeAnthropic, str]) -> None:
    url = claude_upstream[1]
    gw = make_gateway(upstreams(url, '"x-fake-die-after" = "3"', "anthropic").replace(
        'model = "m"', 'model = "claude-opus-4-6"'), policy=policy(""))
    events = sse(gw.url + "/v1/messages", MESSAGES, AV)
    names = [n for n, _ in events]
    assert names[-1] == "error" and "message_stop" not in names
    assert gw.logged()[0]["continued"] == 0


def test_a_request_is_continued_at_most_max_continuations_times(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = gateway(make_gateway, fake_server.url, "")
    events = sse(gw.v1 + "/chat/completions", CHAT, {"x-fake-die-after": "2"})
    assert chat_text(events[:-1]) == "w0 w1 w2 w3 w4 w5 "  # 2 + 2 continuations of 2
    assert "error" in orjson.loads(events[-1][1])
    assert gw.logged()[0]["continued"] == 2


def test_a_prefill_is_sent_without_its_trailing_whitespace_and_the_text_stays_whole(
        make_gateway: Callable[..., GatewayServer],
        claude_upstream: tuple[FakeAnthropic, str]) -> None:
    """The text so far ends in a space, which Anthropic refuses in a prefill: it is sent
    without it, and the space the continuation repeats is not sent twice."""
    app, url = claude_upstream
    gw = make_gateway(upstreams(url, '"x-fake-die-after" = "3", "x-fake-space-after" = "1"',
                                "anthropic").replace('model = "m"', 'model = "claude-3-5-haiku"'),
                      policy=policy(""))
    events = sse(gw.url + "/v1/messages", MESSAGES, {**AV, "x-fake-space-after": "1"})
    text = "".join(orjson.loads(d)["delta"]["text"] for n, d in events
                   if n == "content_block_delta")
    assert text == TOKS and events[-1][0] == "message_stop"
    resent = next(r for r in app.records if r.json and r.json["messages"][-1]["role"]
                  == "assistant").json
    assert resent["messages"][-1]["content"] == "tok0 tok1 tok2"


def test_a_stream_is_continued_on_the_same_model_only_unless_listed_as_equivalent(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    """The other target serves another model: the cut target itself continues (twice);
    once the policy lists both models as equivalent, the other one does."""
    config = upstreams(fake_server.url, '"x-fake-die-after" = "3"')
    config = config.replace('upstream = "quick", model = "m"', 'upstream = "quick", model = "n"')
    gw = make_gateway(config, policy=policy(CONTINUE))
    events = sse(gw.v1 + "/chat/completions", CHAT)
    assert chat_text(events) == WORDS and events[-1][1] == "[DONE]"
    log = gw.logged()[0]
    assert log["continued"] == 2 and log["upstream"] == "slow"
    assert not [r for r in fake.records if r.path.startswith("/quick")]
    gw = make_gateway(config, policy=policy(CONTINUE + '\nequivalent_models = [["m", "n"]]'))
    events = sse(gw.v1 + "/chat/completions", CHAT)
    assert chat_text(events) == WORDS
    assert gw.logged()[0]["continued"] == 1 and gw.logged()[0]["upstream"] == "quick"


@pytest.mark.parametrize(("model", "prefill"), [
    ("claude-3-5-haiku-20241022", True), ("claude-3-7-sonnet-latest", True),
    ("claude-sonnet-4-20250514", True), ("claude-opus-4-1-20250805", True),
    ("claude-opus-4-1", True), ("claude-sonnet-4-5-20250929", True), ("claude-haiku-4-5", True),
    ("claude-opus-4-6", False), ("claude-sonnet-4-6-20260101", False), ("claude-opus-5", False),
    ("gpt-4o", False)])
def test_the_default_prefill_models_are_claude_3_to_4_5(model: str, prefill: bool) -> None:
    assert any(fnmatch.fnmatchcase(model, p) for p in PREFILL_MODELS) is prefill


def test_an_anthropic_client_on_a_continuable_openai_compatible_target_reads_one_answer(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = gateway(make_gateway, fake_server.url, '"x-fake-die-after" = "3"')
    events = sse(gw.url + "/v1/messages", MESSAGES, AV)
    names = [n for n, _ in events]
    assert names.count("message_start") == 1 and names[-1] == "message_stop"
    text = "".join(orjson.loads(d)["delta"].get("text", "") for n, d in events
                   if n == "content_block_delta")
    assert text == WORDS and gw.logged()[0]["continued"] == 1


def test_a_stream_cut_in_its_thinking_ends_with_an_error_event(
        make_gateway: Callable[..., GatewayServer],
        claude_upstream: tuple[FakeAnthropic, str]) -> None:
    url = claude_upstream[1]
    gw = make_gateway(upstreams(url, '"x-fake-thinking" = "4", "x-fake-stall-after" = "2", '
                                '"x-fake-ping-ms" = "20"', "anthropic").replace(
        'model = "m"', 'model = "claude-sonnet-4-5"'),
        policy=policy("stream_idle_timeout_ms = 150"))
    events = sse(gw.url + "/v1/messages", MESSAGES, AV)
    names = [n for n, _ in events]
    assert names[-1] == "error" and "message_stop" not in names
    assert gw.logged()[0]["continued"] == 0 and gw.logged()[0]["stalled"] == "idle"


def test_a_stream_under_a_json_schema_is_not_continued(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    """A schema constrains the output from its start: a continuation would apply it to the
    rest alone, so the cut stream ends with an error event."""
    gw = gateway(make_gateway, fake_server.url, '"x-fake-die-after" = "3"')
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}
    events = sse(gw.v1 + "/chat/completions", {**CHAT, "response_format": schema})
    assert "error" in orjson.loads(events[-1][1]) and gw.logged()[0]["continued"] == 0


def test_the_last_attempts_error_event_before_any_text_keeps_the_upstreams_type(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    """On a continuable target, an in-band error before any text on the request's last
    attempt: nothing to continue, so the client reads the upstream's own error event (its
    type, as without continuation), not a generic one; never [DONE]."""
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-error-midway" = "0"').replace(
        '{ upstream = "quick", model = "m" }', ""), policy=policy(CONTINUE, "max_attempts = 1"))
    events = sse(gw.v1 + "/chat/completions", CHAT)
    assert orjson.loads(events[-1][1])["error"]["type"] == "server_error"
    assert all(d != "[DONE]" for _, d in events)
    log = gw.logged()[0]
    assert (log["error_type"], log["continued"]) == ("server_error", 0)
