"""An OpenAI client calling an Anthropic upstream, whole answers: the Chat Completions request
as a Messages request (one row per mapping rule and per unsupported feature), Claude's
answers and errors as OpenAI's; translated requests checked against the SDKs' own request
types, translated answers parsed by the SDKs' own models and clients; round trips."""

from __future__ import annotations

import re
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletion

from gateway.errors import InvalidRequest, UpstreamError
from gateway.formats.anthropic_to_openai import openai_request
from gateway.formats.openai_to_anthropic import anthropic_request
from tests.gateway.formats.translation import (
    AN_TOOL,
    BREAK,
    EPHEMERAL,
    HI,
    OA_TOOL,
    PDF,
    PNG,
    WEATHER,
    anthropic_error_body,
    anthropic_response,
    assistant,
    call,
    check_anthropic,
    check_openai,
    json_response,
    message_body,
    openai_error,
    openai_response,
    openai_sdk,
    result,
    text,
    tool_msg,
    use,
    user,
)


def to_anthropic(messages: list[dict[str, Any]] | None = None, **fields: Any
                 ) -> dict[str, Any]:
    body = {"model": "gpt-x", "messages": messages or HI, **fields}
    out = anthropic_request(body, "claude-x", 1024)
    check_anthropic(out)
    return out


# --- requests -------------------------------------------------------------------------------

TO_ANTHROPIC = [
    pytest.param({"messages": [{"role": "system", "content": "Be brief."}, user("hi"),
                               {"role": "developer", "content": [text("Use French.")]},
                               assistant("Salut"), user("Again")]},
                 {"system": "Be brief.\n\nUse French.",
                  "messages": [user("hi"), assistant("Salut"), user("Again")]},
                 id="system-and-developer-anywhere-become-the-system-string-in-order"),
    pytest.param({"messages": [{"role": "system", "content": [text("Long rules", **BREAK)]},
                               {"role": "system", "content": "More"}, *HI]},
                 {"system": [text("Long rules", **EPHEMERAL), text("More")]},
                 id="a-cache-breakpoint-in-the-system-keeps-text-blocks"),
    pytest.param({"messages": [user([text("a", prompt_cache_breakpoint={
                      "mode": "explicit", "ttl": "12h"})])]},
                 {"messages": [user([text("a", cache_control={"type": "ephemeral",
                                                              "ttl": "1h"})])]},
                 id="a-12h-breakpoint-becomes-the-1h-ttl"),
    pytest.param({"messages": [user("a"), user([text("b")]), {"role": "user", "name": "x",
                                                             "content": "c"}]},
                 {"messages": [user([text("a"), text("b"), text("c")])]},
                 id="consecutive-user-messages-merge-names-dropped"),
    pytest.param({"messages": [user("a"), assistant(""), user([text("")]), user("b")]},
                 {"messages": [user([text("a"), text("b")])]},
                 id="empty-text-is-dropped-and-the-turns-around-it-merge"),
    pytest.param({"messages": [user([
        text("Look:"),
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}",
                                            "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "https://x.test/cat.jpg"}, **BREAK},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}",
                                  "filename": "a.pdf"}},
        {"type": "file", "file": {"file_data": PDF}}])]},
                 {"messages": [user([
                     text("Look:"),
                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                  "data": PNG}},
                     {"type": "image", "source": {"type": "url",
                                                  "url": "https://x.test/cat.jpg"},
                      **EPHEMERAL},
                     {"type": "document", "source": {"type": "base64", "data": PDF,
                                                     "media_type": "application/pdf"}},
                     {"type": "document", "source": {"type": "base64", "data": PDF,
                                                     "media_type": "application/pdf"}}])]},
                 id="images-and-pdf-files-become-image-and-document-blocks"),
    pytest.param({"messages": [
        user("Weather in Paris and Rome?"),
        assistant("Checking.", tool_calls=[call("call_1", "weather", '{"city":"Paris"}'),
                                           call("functions.weather:1", "weather", "")]),
        tool_msg("call_1", "12C"), tool_msg("functions.weather:1", [text("15C")]),
        user("Thanks")]},
                 {"messages": [
                     user("Weather in Paris and Rome?"),
                     assistant([text("Checking."), use("call_1", "weather", {"city": "Paris"}),
                                use("functions_weather_1", "weather", {})]),
                     user([result("call_1", "12C"), result("functions_weather_1", "15C"),
                           text("Thanks")])]},
                 id="tool-calls-and-results-ids-made-safe-results-first"),
    pytest.param({"messages": [user("go"), assistant(None, tool_calls=[call("c", "f", "{}")]),
                               user("wait"), tool_msg("c", "")]},
                 {"messages": [user("go"), assistant([use("c", "f", {})]),
                               user([result("c"), text("wait")])]},
                 id="tool-results-move-first-and-empty-results-carry-no-content"),
    pytest.param({"messages": [user("hi"), assistant(None, refusal="I can't."), user("ok")]},
                 {"messages": [user("hi"), assistant("I can't."), user("ok")]},
                 id="an-assistant-refusal-is-its-text"),
    pytest.param({"max_completion_tokens": 50, "max_tokens": 70}, {"max_tokens": 50},
                 id="max-completion-tokens-wins"),
    pytest.param({"max_tokens": 70}, {"max_tokens": 70}, id="max-tokens"),
    pytest.param({}, {"max_tokens": 1024}, id="default-max-tokens"),
    pytest.param({"temperature": 0.2, "top_p": 0.9, "top_k": 40},
                 {"temperature": 0.2, "top_p": 0.9, "top_k": 40}, id="sampling"),
    pytest.param({"temperature": 1, "top_p": 1.0}, {"temperature": None, "top_p": None},
                 id="sampling-defaults-left-out"),
    pytest.param({"stop": "END"}, {"stop_sequences": ["END"]}, id="stop-string"),
    pytest.param({"stop": ["a", "", "b"]}, {"stop_sequences": ["a", "b"]}, id="stop-list"),
    pytest.param({"user": "u-1", "safety_identifier": "s"}, {"metadata": {"user_id": "u-1"}},
                 id="user"),
    pytest.param({"safety_identifier": "s-1"}, {"metadata": {"user_id": "s-1"}},
                 id="safety-identifier-when-no-user"),
    pytest.param({"stream": True, "stream_options": {"include_usage": True}},
                 {"stream": True}, id="stream"),
    pytest.param({"tools": [OA_TOOL, {"type": "function", "function": {"name": "now"}},
                            {"type": "function", "function": {
                                "name": "s", "strict": True,
                                "parameters": {"properties": {}}}}]},
                 {"tools": [AN_TOOL, {"name": "now", "input_schema": {
                     "type": "object", "properties": {}}},
                            {"name": "s", "strict": True, "input_schema": {
                                "type": "object", "properties": {}}}],
                  "tool_choice": None},
                 id="tools"),
    pytest.param({"tools": [OA_TOOL], "tool_choice": "auto"}, {"tool_choice": {"type": "auto"}},
                 id="tool-choice-auto"),
    pytest.param({"tools": [OA_TOOL], "tool_choice": "required"},
                 {"tool_choice": {"type": "any"}}, id="tool-choice-required"),
    pytest.param({"tools": [OA_TOOL], "tool_choice": "none"},
                 {"tool_choice": {"type": "none"}}, id="tool-choice-none"),
    pytest.param({"tools": [OA_TOOL], "tool_choice": {"type": "function",
                                                      "function": {"name": "weather"}}},
                 {"tool_choice": {"type": "tool", "name": "weather"}}, id="tool-choice-named"),
    pytest.param({"tools": [OA_TOOL], "parallel_tool_calls": False},
                 {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
                 id="no-parallel-tool-calls"),
    pytest.param({"tools": [OA_TOOL], "tool_choice": "required", "parallel_tool_calls": False},
                 {"tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
                 id="no-parallel-tool-calls-on-a-choice"),
    pytest.param({"tool_choice": "required", "parallel_tool_calls": False},
                 {"tools": None, "tool_choice": None}, id="tool-choice-without-tools-dropped"),
    pytest.param({"response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "schema": WEATHER, "strict": True}}},
                 {"output_config": {"format": {"type": "json_schema", "schema": WEATHER}}},
                 id="json-schema-output"),
    pytest.param({"response_format": {"type": "text"}}, {"output_config": None},
                 id="text-output"),
]


@pytest.mark.parametrize(("fields", "expected"), TO_ANTHROPIC)
def test_openai_requests_become_anthropic_requests(fields, expected):
    out = to_anthropic(**fields)
    assert out["model"] == "claude-x"
    for key, value in expected.items():
        assert out.get(key) == value, key


@pytest.mark.parametrize("fields", [
    {"n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": False,
     "top_logprobs": 0, "logit_bias": {}, "modalities": ["text"], "verbosity": "medium",
     "parallel_tool_calls": True, "seed": None, "audio": None, "response_format": None},
    {"stream_options": {"include_usage": True}, "store": True, "service_tier": "flex",
     "prompt_cache_key": "k", "prompt_cache_retention": "24h", "metadata": {"a": "b"},
     "prompt_cache_options": {"mode": "implicit"}},
], ids=["defaults-that-change-nothing", "dropped-fields"])
def test_fields_that_change_nothing_are_left_out(fields):
    assert to_anthropic(**fields) == to_anthropic()


def test_anthropic_request_keys_put_the_cached_prefix_first():
    out = to_anthropic([{"role": "system", "content": "S"}, *HI], tools=[OA_TOOL],
                       tool_choice="auto", temperature=0.5, stop="x", user="u", stream=False)
    assert list(out) == ["model", "max_tokens", "tools", "tool_choice", "system", "messages",
                         "temperature", "stop_sequences", "metadata", "stream"]


def bad_call(arguments: str) -> list[dict[str, Any]]:
    return [user("go"), assistant(None, tool_calls=[call("c", "f", arguments)])]


ANTHROPIC_400 = [
    ({"n": 2}, "n", "'n' > 1"),
    ({"logprobs": True}, "logprobs", "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs", "top_logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format", "json_object"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "audio output"),
    ({"modalities": ["text", "audio"]}, "modalities", "audio output"),
    ({"logit_bias": {"50256": -100}}, "logit_bias", "logit_bias"),
    ({"seed": 7}, "seed", "seed"),
    ({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty"),
    ({"frequency_penalty": -1}, "frequency_penalty", "frequency_penalty"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction", "predicted outputs"),
    ({"reasoning_effort": "high"}, "reasoning_effort", "'thinking'"),
    ({"web_search_options": {}}, "web_search_options", "web_search_options"),
    ({"moderation": {"model": "omni"}}, "moderation", "moderation"),
    ({"verbosity": "low"}, "verbosity", "verbosity"),
    ({"functions": [{"name": "f"}]}, "functions", "legacy 'functions'"),
    ({"function_call": "auto"}, "function_call", "legacy 'function_call'"),
    ({"min_p": 0.1}, "min_p", "'min_p'"),
    ({"temperature": 1.5}, "temperature", "'temperature' above 1"),
    ({"tools": [OA_TOOL, {"type": "custom", "custom": {"name": "g"}}]}, "tools[1].type",
     "'custom' tools"),
    ({"tools": [OA_TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}},
     "tool_choice", "allowed_tools"),
    ({"messages": [user([text("say"), {"type": "input_audio", "input_audio": {
        "data": "AAA", "format": "wav"}}])]}, "messages[0].content[1]", "'input_audio'"),
    ({"messages": [*HI, {"role": "function", "name": "f", "content": "1"}]},
     "messages[1].role", "legacy 'function' messages"),
    ({"messages": [*HI, assistant(None, function_call={"name": "f", "arguments": "{}"})]},
     "messages[1].function_call", "legacy 'function_call'"),
    ({"messages": [*HI, assistant(None, audio={"id": "a1"})]}, "messages[1].audio",
     "assistant audio"),
    ({"messages": bad_call("[1, 2]")}, "messages[1].tool_calls[0].function.arguments",
     "JSON object"),
    ({"messages": bad_call('{"city": ')}, "messages[1].tool_calls[0].function.arguments",
     "JSON object"),
    ({"messages": [user([{"type": "file", "file": {"file_id": "file-1"}}])]},
     "messages[0].content[0].file", "file ids"),
    ({"messages": [user([{"type": "file", "file": {"file_data": "data:text/csv;base64,YQ=="}}])]},
     "messages[0].content[0].file", "other than PDF"),
    ({"messages": [user([{"type": "image_url", "image_url": {
        "url": "data:image/bmp;base64,Qk0="}}])]}, "messages[0].content[0].image_url.url",
     "images other than"),
    ({"messages": [{"role": "system", "content": "S"}, assistant("Hello!"), user("hi")]},
     "messages[1]", "starts with an assistant message"),
    ({"messages": [{"role": "system", "content": "S"}]}, "messages", "a user message"),
]


@pytest.mark.parametrize(("fields", "param", "feature"), ANTHROPIC_400,
                         ids=[row[1] + "-" + re.sub(r"\W+", "-", row[2]).strip("-")
                              for row in ANTHROPIC_400])
def test_what_anthropic_cannot_do_is_a_400_naming_it(fields, param, feature):
    with pytest.raises(InvalidRequest) as caught:
        anthropic_request({"model": "gpt-x", "messages": HI, **fields}, "claude-x", 1024)
    error = caught.value
    assert (error.status, error.param) == (400, param)
    assert feature in error.message
    assert error.code in ("unsupported_parameter", "unsupported_value", "invalid_value")
    if error.code != "invalid_value":
        assert "Anthropic upstream" in error.message


def test_an_openai_request_survives_the_trip_through_anthropic():
    original = {
        "model": "llama",
        "messages": [{"role": "system", "content": "Be brief."}, user("Weather in Paris?"),
                     assistant(None, tool_calls=[call("call_1", "weather", '{"city":"Paris"}')]),
                     tool_msg("call_1", "12C"), assistant("12C in Paris."), user("Thanks")],
        "tools": [OA_TOOL], "tool_choice": "required", "parallel_tool_calls": False,
        "max_tokens": 100, "temperature": 0.5, "top_p": 0.9, "stop": ["END", "STOP"],
        "user": "u-1", "stream": True, "stream_options": {"include_usage": True},
    }
    there = anthropic_request(original, "claude-x", 1024)
    check_anthropic(there)
    back = openai_request(there, "llama")
    check_openai(back)
    assert back == original


# --- answers --------------------------------------------------------------------------------

OPENAI_ANSWERS = [
    pytest.param(message_body([text("Hello"), text(" there")], usage={
        "input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 5}),
                 {"content": "Hello there", "tool_calls": None}, "stop",
                 {"prompt_tokens": 45, "completion_tokens": 4, "total_tokens": 49,
                  "prompt_tokens_details": {"cached_tokens": 30}},
                 id="text-joined-and-usage"),
    pytest.param(message_body([{"type": "thinking", "thinking": "hmm", "signature": "s"},
                               text("Checking."),
                               use("toolu_1", "weather", {"city": "Paris"})], "tool_use"),
                 {"content": "Checking.", "tool_calls": [call("toolu_1", "weather",
                                                              '{"city":"Paris"}')]},
                 "tool_calls", None, id="tool-use-thinking-dropped"),
    pytest.param(message_body([use("toolu_1", "now", {})], "tool_use"),
                 {"content": None, "tool_calls": [call("toolu_1", "now", "{}")]},
                 "tool_calls", None, id="tool-use-only"),
    pytest.param(message_body([text("Hel")], "max_tokens"), {"content": "Hel"}, "length", None,
                 id="max-tokens"),
    pytest.param(message_body([], "refusal"), {"content": None}, "content_filter", None,
                 id="refusal"),
    pytest.param(message_body([text("Done")], "stop_sequence"), {"content": "Done"}, "stop",
                 None, id="stop-sequence"),
]


@pytest.mark.parametrize(("body", "message", "finish", "usage"), OPENAI_ANSWERS)
def test_anthropic_messages_become_completions(body, message, finish, usage):
    raw = openai_response(body)
    parsed = ChatCompletion.model_validate_json(raw)
    assert (parsed.id, parsed.model, parsed.object) == \
        ("chatcmpl-msg_01XYZ", "claude-x", "chat.completion")
    out = orjson.loads(raw)
    choice = out["choices"][0]
    assert (choice["finish_reason"], choice["index"], choice["logprobs"]) == (finish, 0, None)
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["refusal"] is None
    for key, value in message.items():
        assert choice["message"].get(key) == value, key
    if usage is not None:
        assert out["usage"] == usage


def test_openai_answer_model_and_missing_usage():
    out = orjson.loads(openai_response(orjson.dumps({"content": [text("x")],
                                                     "stop_reason": "end_turn"}), "mine"))
    assert out["model"] == "mine"
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", out["id"])
    assert out["usage"]["total_tokens"] == 0


def test_an_anthropic_answer_survives_the_trip_through_openai():
    original = message_body([text("Checking."), use("toolu_1", "weather", {"city": "Paris"})],
                            "tool_use", usage={"input_tokens": 10, "output_tokens": 4,
                                               "cache_creation_input_tokens": 0,
                                               "cache_read_input_tokens": 30})
    assert orjson.loads(anthropic_response(openai_response(original))) == orjson.loads(original)


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"type": "message"}'])
def test_a_broken_message_is_an_upstream_error(body):
    with pytest.raises(UpstreamError):
        openai_response(body)


# --- errors ---------------------------------------------------------------------------------

OPENAI_ERRORS = [
    (400, anthropic_error_body("invalid_request_error", "messages: bad"), "messages: bad",
     "invalid_request_error", "invalid_request"),
    (401, anthropic_error_body("authentication_error", "invalid x-api-key"),
     "invalid x-api-key", "authentication_error", "invalid_api_key"),
    (402, anthropic_error_body("billing_error", "no credit"), "no credit",
     "insufficient_quota", "insufficient_quota"),
    (403, anthropic_error_body("permission_error", "nope"), "nope", "permission_error",
     "forbidden"),
    (404, anthropic_error_body("not_found_error", "model: x"), "model: x",
     "invalid_request_error", "not_found"),
    (413, anthropic_error_body("request_too_large", "too big"), "too big",
     "invalid_request_error", "request_too_large"),
    (429, anthropic_error_body("rate_limit_error", "slow down"), "slow down",
     "rate_limit_error", "rate_limit_exceeded"),
    (500, anthropic_error_body("api_error", "oops"), "oops", "server_error", "internal_error"),
    (504, anthropic_error_body("timeout_error", "late"), "late", "upstream_error",
     "upstream_timeout"),
    (529, anthropic_error_body("overloaded_error", "Overloaded"), "Overloaded",
     "overloaded_error", "overloaded"),
    (418, anthropic_error_body("teapot_error", "short and stout"), "short and stout",
     "upstream_error", "upstream_error"),
    (502, b"<html>Bad Gateway</html>", "upstream error (HTTP 502)", "server_error",
     "internal_error"),
    (429, b'{"type": "error"}', "upstream error (HTTP 429)", "rate_limit_error",
     "rate_limit_exceeded"),
]


@pytest.mark.parametrize(("status", "body", "message", "type_", "code"), OPENAI_ERRORS,
                         ids=[f"{row[0]}-{row[3]}" for row in OPENAI_ERRORS])
def test_anthropic_errors_become_openai_errors(status, body, message, type_, code):
    assert orjson.loads(openai_error(status, body)) == {"error": {
        "message": message, "type": type_, "param": None, "code": code}}


# --- the openai SDK, answered by translated bodies ------------------------------------------

CLAUDE_ANSWER = message_body([text("Checking."), use("toolu_1", "weather", {"city": "Paris"})],
                             "tool_use", usage={"input_tokens": 10, "output_tokens": 4})


def test_an_openai_client_calls_a_claude_model():
    """The openai SDK's request goes out in the Messages format; Claude's answer comes back
    as a completion the SDK reads."""
    seen: list[dict[str, Any]] = []

    def claude(request: httpx2.Request) -> httpx2.Response:
        seen.append(anthropic_request(orjson.loads(request.content), "claude-x", 1024))
        return json_response(200, openai_response(CLAUDE_ANSWER))

    with openai_sdk(claude) as client:
        answer = client.chat.completions.create(
            model="claude-x", messages=[{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Weather in Paris?"}],
            tools=[OA_TOOL], tool_choice="auto", max_completion_tokens=200, n=1)
    check_anthropic(seen[0])
    assert (seen[0]["system"], seen[0]["max_tokens"]) == ("Be brief.", 200)
    choice = answer.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", "Checking.")
    assert choice.message.tool_calls[0].function.arguments == '{"city":"Paris"}'
    assert answer.usage.prompt_tokens == 10


@pytest.mark.parametrize(("status", "kind", "error"), [
    (400, "invalid_request_error", openai.BadRequestError),
    (401, "authentication_error", openai.AuthenticationError),
    (429, "rate_limit_error", openai.RateLimitError),
    (529, "overloaded_error", openai.InternalServerError),
])
def test_the_openai_sdk_raises_on_translated_anthropic_errors(status, kind, error):
    body = openai_error(status, anthropic_error_body(kind, "why"))
    with openai_sdk(lambda _: json_response(status, body)) as client, \
            pytest.raises(error) as caught:
        client.chat.completions.create(model="claude-x", messages=HI)
    assert "why" in str(caught.value)


def test_the_translation_is_pure():
    """Inputs are not changed in place: the gateway may retry or log them."""
    body = {"model": "gpt-x", "messages": [user([text("a")]), assistant("b"), user("c")],
            "tools": [OA_TOOL], "parallel_tool_calls": False}
    frozen = orjson.dumps(body)
    anthropic_request(body, "claude-x", 10)
    assert orjson.dumps(body) == frozen
