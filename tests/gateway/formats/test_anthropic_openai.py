"""OpenAI Chat Completions <-> Anthropic Messages, pure: one row per mapping rule and per
unsupported feature, both ways; round trips; translated requests checked against the SDKs'
own request types, translated answers parsed by the SDKs' own models and clients."""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest
from anthropic.types import Message
from anthropic.types.message_create_params import (
    MessageCreateParamsBase,
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from anthropic.types.shared.error_response import ErrorResponse
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsBase,
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter

from gateway.errors import InvalidRequest, UpstreamError
from gateway.formats.anthropic_openai import (
    anthropic_error,
    anthropic_request,
    anthropic_response,
    openai_error,
    openai_request,
    openai_response,
)

HI = [{"role": "user", "content": "hi"}]
PNG = "iVBORw0KGgo="
PDF = "JVBERi0xLjQK"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}
OA_TOOL = {"type": "function", "function": {"name": "weather", "description": "Weather now",
                                            "parameters": WEATHER}}
AN_TOOL = {"name": "weather", "description": "Weather now", "input_schema": WEATHER}


# --- checks against the SDKs' request types -----------------------------------------------

@functools.cache
def adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def drain(value: Any) -> None:
    """Validate everything: pydantic checks ``Iterable`` fields lazily, as they are read."""
    if isinstance(value, dict):
        for item in value.values():
            drain(item)
    elif isinstance(value, (list, tuple)) or type(value).__name__ == "ValidatorIterator":
        for item in value:
            drain(item)


def keys_of(typed_dict: Any) -> frozenset[str]:
    return frozenset(typed_dict.__required_keys__ | typed_dict.__optional_keys__)


def no_nulls(value: Any, where: str = "") -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert item is not None, f"{where}.{key} is null"
            no_nulls(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            no_nulls(item, f"{where}[{i}]")


# The anthropic SDK (1.0+) no longer types the deprecated sampling parameters, which the API
# still takes for the models that sample with them.
ANTHROPIC_KEYS = keys_of(MessageCreateParamsBase) | {"stream", "temperature", "top_p", "top_k"}


def check_anthropic(request: dict[str, Any]) -> None:
    """What the real Messages API insists on: its types, alternating turns starting with the
    user, tool results first in their message, no empty text, no nulls."""
    assert set(request) <= ANTHROPIC_KEYS
    kind = MessageCreateParamsStreaming if request.get("stream") \
        else MessageCreateParamsNonStreaming
    drain(adapter(kind).validate_python(request))
    no_nulls(request)
    roles = [m["role"] for m in request["messages"]]
    assert roles[0] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    for message in request["messages"]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        assert blocks
        kinds = [b["type"] for b in blocks]
        assert kinds == sorted(kinds, key=lambda k: k != "tool_result")
        assert all(b["text"] for b in blocks if b["type"] == "text")


def check_openai(request: dict[str, Any]) -> None:
    assert set(request) <= keys_of(CompletionCreateParamsBase) | {"stream", "top_k"}
    kind = CompletionCreateParamsStreaming if request.get("stream") \
        else CompletionCreateParamsNonStreaming
    drain(adapter(kind).validate_python(request))


def to_anthropic(messages: list[dict[str, Any]] | None = None, **fields: Any
                 ) -> dict[str, Any]:
    body = {"model": "gpt-x", "messages": messages or HI, **fields}
    out = anthropic_request(body, "claude-x", 1024)
    check_anthropic(out)
    return out


def to_openai(messages: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    body = {"model": "claude-x", "max_tokens": 256, "messages": messages or HI, **fields}
    out = openai_request(body, "llama")
    check_openai(out)
    return out


# --- OpenAI request -> Anthropic request --------------------------------------------------

def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any, **fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **fields}


def text(value: str, **fields: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **fields}


def call(id_: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_msg(id_: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": id_, "content": content}


def result(id_: str, content: Any = None, **fields: Any) -> dict[str, Any]:
    out = {"type": "tool_result", "tool_use_id": id_, **fields}
    if content is not None:
        out["content"] = content
    return out


def use(id_: str, name: str, input_: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": input_}


BREAK = {"prompt_cache_breakpoint": {"mode": "explicit"}}
EPHEMERAL = {"cache_control": {"type": "ephemeral"}}

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


# --- Anthropic request -> OpenAI request --------------------------------------------------

TO_OPENAI = [
    pytest.param({"system": "Be brief."},
                 {"messages": [{"role": "system", "content": "Be brief."}, user("hi")]},
                 id="system-string"),
    pytest.param({"system": [text("Rules", **EPHEMERAL), text("More")]},
                 {"messages": [{"role": "system", "content": "Rules\n\nMore"}, user("hi")]},
                 id="system-blocks-joined-cache-control-dropped"),
    pytest.param({"messages": [user("a"), {"role": "system", "content": "Now in French."},
                               user("b")]},
                 {"messages": [user("a"), {"role": "system", "content": "Now in French."},
                               user("b")]},
                 id="a-system-message-in-place"),
    pytest.param({"messages": [user([text("a", **EPHEMERAL), text("b")])]},
                 {"messages": [user("a\n\nb")]}, id="text-only-content-is-a-string"),
    pytest.param({"messages": [user([
        text("Look:"),
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.jpg"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": PDF}, "title": "Report"}])]},
                 {"messages": [user([
                     text("Look:"),
                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                     {"type": "image_url", "image_url": {"url": "https://x.test/cat.jpg"}},
                     {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}",
                                               "filename": "document.pdf"}}])]},
                 id="images-and-pdf-documents-become-parts"),
    pytest.param({"messages": [user([
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "Doc"}},
        {"type": "document", "source": {"type": "content", "content": [text("Part")]}},
        text("Summarize")])]},
                 {"messages": [user("Doc\n\nPart\n\nSummarize")]},
                 id="text-documents-become-text"),
    pytest.param({"messages": [
        user("Weather?"),
        assistant([{"type": "thinking", "thinking": "hmm", "signature": "s"},
                   text("Checking."), use("toolu_1", "weather", {"city": "Paris"}),
                   use("toolu_2", "now", {})]),
        user([result("toolu_1", "12C"), result("toolu_2", [text("10:00"), text("UTC")]),
              text("Thanks")])]},
                 {"messages": [
                     user("Weather?"),
                     assistant("Checking.", tool_calls=[
                         call("toolu_1", "weather", '{"city":"Paris"}'),
                         call("toolu_2", "now", "{}")]),
                     tool_msg("toolu_1", "12C"), tool_msg("toolu_2", "10:00\n\nUTC"),
                     user("Thanks")]},
                 id="tool-use-and-results-thinking-dropped"),
    pytest.param({"messages": [
        user("go"), assistant([use("t", "f", {})]),
        user([result("t", "boom", is_error=True)]), assistant([use("u", "f", {})]),
        user([result("u", is_error=True)])]},
                 {"messages": [user("go"), assistant(None, tool_calls=[call("t", "f", "{}")]),
                               tool_msg("t", "Error: boom"),
                               assistant(None, tool_calls=[call("u", "f", "{}")]),
                               tool_msg("u", "Error")]},
                 id="tool-errors-are-prefixed"),
    pytest.param({"messages": [user("a"), assistant([{"type": "redacted_thinking",
                                                      "data": "x"}]), user("b")]},
                 {"messages": [user("a"), user("b")]},
                 id="a-thinking-only-assistant-turn-is-dropped"),
    pytest.param({"temperature": 0.3, "top_p": 0.8, "top_k": 20, "stop_sequences": ["END"],
                  "metadata": {"user_id": "u-1"}},
                 {"max_tokens": 256, "temperature": 0.3, "top_p": 0.8, "top_k": 20,
                  "stop": ["END"], "user": "u-1"}, id="sampling-stop-and-user"),
    pytest.param({"stop_sequences": [], "metadata": {}}, {"stop": None, "user": None},
                 id="empty-stop-and-metadata"),
    pytest.param({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}},
                 id="stream-asks-for-usage"),
    pytest.param({"tools": [{**AN_TOOL, "cache_control": {"type": "ephemeral"}},
                            {"type": "custom", "name": "s", "strict": True,
                             "input_schema": {"type": "object"}}]},
                 {"tools": [OA_TOOL, {"type": "function", "function": {
                     "name": "s", "parameters": {"type": "object"}, "strict": True}}]},
                 id="custom-tools-become-functions"),
    pytest.param({"tools": [AN_TOOL], "tool_choice": {"type": "auto"}},
                 {"tool_choice": "auto", "parallel_tool_calls": None}, id="tool-choice-auto"),
    pytest.param({"tools": [AN_TOOL], "tool_choice": {"type": "any",
                                                      "disable_parallel_tool_use": True}},
                 {"tool_choice": "required", "parallel_tool_calls": False},
                 id="tool-choice-any-no-parallel"),
    pytest.param({"tools": [AN_TOOL], "tool_choice": {"type": "none"}},
                 {"tool_choice": "none"}, id="tool-choice-none"),
    pytest.param({"tools": [AN_TOOL], "tool_choice": {"type": "tool", "name": "weather"}},
                 {"tool_choice": {"type": "function", "function": {"name": "weather"}}},
                 id="tool-choice-named"),
    pytest.param({"tools": [], "tool_choice": {"type": "any"}},
                 {"tools": None, "tool_choice": None}, id="no-tools-no-choice"),
    pytest.param({"output_config": {"effort": "high", "format": {
        "type": "json_schema", "schema": WEATHER}}},
                 {"response_format": {"type": "json_schema", "json_schema": {
                     "name": "output", "schema": WEATHER, "strict": True}}},
                 id="json-schema-output"),
    pytest.param({"thinking": {"type": "disabled"}, "service_tier": "auto", "speed": "fast",
                  "diagnostics": {"previous_message_id": "m"},
                  "cache_control": {"type": "ephemeral"}, "inference_geo": "global"},
                 {"messages": [user("hi")], "max_tokens": 256},
                 id="fields-that-change-nothing-dropped"),
]


@pytest.mark.parametrize(("fields", "expected"), TO_OPENAI)
def test_anthropic_requests_become_openai_requests(fields, expected):
    out = to_openai(**fields)
    assert out["model"] == "llama"
    for key, value in expected.items():
        assert out.get(key) == value, key


def test_openai_request_without_extras_is_minimal():
    assert to_openai() == {"model": "llama", "messages": [user("hi")], "max_tokens": 256}


OPENAI_400 = [
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking", "thinking"),
    ({"thinking": {"type": "adaptive"}}, "thinking", "thinking"),
    ({"container": "c-1"}, "container", "'container'"),
    ({"mcp_servers": [{"type": "url", "url": "https://m.test", "name": "m"}]}, "mcp_servers",
     "'mcp_servers'"),
    ({"inference_geo": "us"}, "inference_geo", "'inference_geo'"),
    ({"output_config": {"effort": "low"}}, "output_config.effort", "effort"),
    ({"context_management": {"edits": []}}, "context_management", "'context_management'"),
    ({"tools": [AN_TOOL, {"type": "web_search_20250305", "name": "web_search"}]}, "tools[1]",
     "server tool 'web_search_20250305'"),
    ({"tools": [{**AN_TOOL, "defer_loading": True}]}, "tools[0].defer_loading",
     "'defer_loading'"),
    ({"messages": [user([result("t", [{"type": "image", "source": {
        "type": "url", "url": "https://x.test/a.png"}}])])]},
     "messages[0].content[0].content[0]", "'image' blocks inside a tool_result"),
    ({"messages": [user([{"type": "image", "source": {"type": "file", "file_id": "f"}}])]},
     "messages[0].content[0].source", "image sources of type 'file'"),
    ({"messages": [user([{"type": "document", "source": {
        "type": "url", "url": "https://x.test/a.pdf"}}])]},
     "messages[0].content[0].source", "document sources of type 'url'"),
    ({"messages": [user([{"type": "search_result", "source": "s", "title": "t",
                          "content": [text("x")]}])]},
     "messages[0].content[0]", "'search_result' content blocks"),
    ({"messages": [*HI, assistant([{"type": "server_tool_use", "id": "s", "name": "web_search",
                                    "input": {}}])]},
     "messages[1].content[0]", "'server_tool_use' blocks"),
    ({"messages": [*HI, assistant("The answer is (")]}, "messages[1]", "prefill"),
]


@pytest.mark.parametrize(("fields", "param", "feature"), OPENAI_400,
                         ids=[row[1] + "-" + re.sub(r"\W+", "-", row[2]).strip("-")
                              for row in OPENAI_400])
def test_what_openai_cannot_do_is_a_400_naming_it(fields, param, feature):
    with pytest.raises(InvalidRequest) as caught:
        openai_request({"model": "claude-x", "max_tokens": 64, "messages": HI, **fields},
                       "llama")
    error = caught.value
    assert (error.status, error.param) == (400, param)
    assert feature in error.message
    assert error.code in ("unsupported_parameter", "unsupported_value")
    assert "OpenAI-compatible upstream" in error.message


# --- round trips ------------------------------------------------------------------------------

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


def test_an_anthropic_request_survives_the_trip_through_openai():
    original = {
        "model": "claude-x", "max_tokens": 100, "tools": [AN_TOOL],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        "system": "Be brief.",
        "messages": [user("Weather in Paris?"),
                     assistant([text("Checking."), use("toolu_1", "weather", {"city": "Paris"})]),
                     user([result("toolu_1", "12C"), text("Thanks")]),
                     assistant("12C."), user("Bye")],
        "temperature": 0.5, "top_k": 5, "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"}, "stream": False,
    }
    there = openai_request(original, "llama")
    check_openai(there)
    back = anthropic_request(there, "claude-x", 1024)
    check_anthropic(back)
    assert back == original


# --- answers ------------------------------------------------------------------------------

def completion(message: dict[str, Any], finish: str | None = "stop",
               **fields: Any) -> bytes:
    return orjson.dumps({"id": "chatcmpl-abc123", "object": "chat.completion",
                         "created": 1, "model": "llama-3",
                         "choices": [{"index": 0, "message": {"role": "assistant", **message},
                                      "logprobs": None, "finish_reason": finish}],
                         **fields})


USAGE = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25,
         "prompt_tokens_details": {"cached_tokens": 8}}

ANTHROPIC_ANSWERS = [
    pytest.param(completion({"content": "Hello!"}, usage=USAGE),
                 {"content": [text("Hello!")], "stop_reason": "end_turn",
                  "usage": {"input_tokens": 12, "output_tokens": 5,
                            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 8}},
                 id="text-and-usage"),
    pytest.param(completion({"content": None, "tool_calls": [
        call("call_1", "weather", '{"city":"Paris"}'),
        call("functions.now:1", "now", "not json"), call("c3", "f", "[1]")]}, "tool_calls"),
                 {"content": [use("call_1", "weather", {"city": "Paris"}),
                              use("functions_now_1", "now", {}), use("c3", "f", {})],
                  "stop_reason": "tool_use"},
                 id="tool-calls-unparsable-arguments-become-empty-input"),
    pytest.param(completion({"content": "Let me check.",
                             "tool_calls": [call("c", "f", "{}")]}, "stop"),
                 {"content": [text("Let me check."), use("c", "f", {})],
                  "stop_reason": "tool_use"}, id="tool-calls-with-finish-stop-are-tool-use"),
    pytest.param(completion({"content": "Hel"}, "length"), {"stop_reason": "max_tokens"},
                 id="length"),
    pytest.param(completion({"content": None, "refusal": "I can't help."}, "content_filter"),
                 {"content": [text("I can't help.")], "stop_reason": "refusal"},
                 id="refusal"),
    pytest.param(completion({"content": "", "reasoning_content": "hmm"}),
                 {"content": [], "usage": {"input_tokens": 0, "output_tokens": 0,
                                           "cache_creation_input_tokens": 0,
                                           "cache_read_input_tokens": 0}},
                 id="empty-answer-reasoning-dropped-no-usage"),
]


@pytest.mark.parametrize(("body", "expected"), ANTHROPIC_ANSWERS)
def test_completions_become_anthropic_messages(body, expected):
    raw = anthropic_response(body)
    message = Message.model_validate_json(raw)
    assert (message.id, message.model, message.role, message.type, message.stop_sequence) == \
        ("msg_abc123", "llama-3", "assistant", "message", None)
    out = orjson.loads(raw)
    for key, value in expected.items():
        assert out[key] == value, key


def test_anthropic_answer_model_and_id():
    raw = anthropic_response(orjson.dumps({"choices": [{"message": {"content": "x"},
                                                        "finish_reason": "stop"}]}), "mine")
    out = orjson.loads(raw)
    assert out["model"] == "mine"
    assert re.fullmatch(r"msg_[0-9a-f]{32}", out["id"])


def message_body(content: list[dict[str, Any]], stop: str | None = "end_turn",
                 **fields: Any) -> bytes:
    return orjson.dumps({"id": "msg_01XYZ", "type": "message", "role": "assistant",
                         "model": "claude-x", "content": content, "stop_reason": stop,
                         "stop_sequence": None, **fields})


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


def test_an_openai_answer_survives_the_trip_through_anthropic():
    original = completion({"content": "Checking.", "refusal": None,
                           "tool_calls": [call("call_1", "weather", '{"city":"Paris"}')]},
                          "tool_calls", usage=USAGE)
    back = orjson.loads(openai_response(anthropic_response(original)))
    expected = orjson.loads(original)
    for out in (back, expected):
        del out["id"], out["created"]
    assert back == expected


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"choices": []}', b'{"error": {}}'])
def test_a_broken_completion_is_an_upstream_error(body):
    with pytest.raises(UpstreamError):
        anthropic_response(body)


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"type": "message"}'])
def test_a_broken_message_is_an_upstream_error(body):
    with pytest.raises(UpstreamError):
        openai_response(body)


# --- errors ---------------------------------------------------------------------------------

def anthropic_error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message},
                         "request_id": "req_1"})


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


def openai_error_body(message: str, type_: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None,
                                   "code": None}})


ANTHROPIC_ERRORS = [
    (400, openai_error_body("context too long"), 400, "invalid_request_error",
     "context too long"),
    (401, openai_error_body("bad key"), 401, "authentication_error", "bad key"),
    (403, openai_error_body("forbidden"), 403, "permission_error", "forbidden"),
    (404, openai_error_body("no model"), 404, "not_found_error", "no model"),
    (413, openai_error_body("too big"), 413, "request_too_large", "too big"),
    (422, openai_error_body("unprocessable"), 422, "invalid_request_error", "unprocessable"),
    (429, openai_error_body("slow down", "requests"), 429, "rate_limit_error", "slow down"),
    (500, openai_error_body("oops", "server_error"), 500, "api_error", "oops"),
    (502, openai_error_body("upstream down", "upstream_error"), 502, "api_error",
     "upstream down"),
    (503, openai_error_body("shed", "overloaded_error"), 529, "overloaded_error", "shed"),
    (504, openai_error_body("late"), 504, "timeout_error", "late"),
    (400, b'{"object": "error", "message": "vllm says no", "code": 400}', 400,
     "invalid_request_error", "vllm says no"),
    (422, b'{"detail": "fastapi says no"}', 422, "invalid_request_error", "fastapi says no"),
    (500, b'{"error": "plain string"}', 500, "api_error", "plain string"),
    (503, b"Service Unavailable", 529, "overloaded_error", "upstream error (HTTP 503)"),
]


@pytest.mark.parametrize(("status", "body", "out_status", "type_", "message"),
                         ANTHROPIC_ERRORS, ids=[f"{row[0]}-{row[3]}" for row in ANTHROPIC_ERRORS])
def test_openai_errors_become_anthropic_errors(status, body, out_status, type_, message):
    got_status, raw = anthropic_error(status, body)
    assert got_status == out_status
    assert orjson.loads(raw) == {"type": "error", "error": {"type": type_, "message": message}}
    if type_ != "request_too_large":  # in Anthropic's docs, not in its SDK's error union
        assert ErrorResponse.model_validate_json(raw).error.type == type_


# --- the SDKs, answered by translated bodies ------------------------------------------------

Handler = Callable[[httpx2.Request], httpx2.Response]


def json_response(status: int, content: bytes) -> httpx2.Response:
    return httpx2.Response(status, content=content,
                           headers={"content-type": "application/json"})


def openai_sdk(handler: Handler) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url="http://gateway.test/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def anthropic_sdk(handler: Handler) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="k", base_url="http://gateway.test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


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


def test_an_anthropic_client_calls_an_openai_compatible_model():
    seen: list[dict[str, Any]] = []
    answer_body = completion({"content": "Checking.", "tool_calls": [
        call("call_1", "weather", '{"city":"Paris"}')]}, "tool_calls", usage=USAGE)

    def llama(request: httpx2.Request) -> httpx2.Response:
        seen.append(openai_request(orjson.loads(request.content), "llama"))
        return json_response(200, anthropic_response(answer_body))

    with anthropic_sdk(llama) as client:
        message = client.messages.create(
            model="llama", max_tokens=200, system="Be brief.", tools=[AN_TOOL],
            messages=[{"role": "user", "content": "Weather in Paris?"}])
    check_openai(seen[0])
    assert seen[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert message.stop_reason == "tool_use"
    assert message.content[1].input == {"city": "Paris"}
    assert message.usage.cache_read_input_tokens == 8


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


@pytest.mark.parametrize(("status", "error"), [
    (400, anthropic.BadRequestError), (404, anthropic.NotFoundError),
    (413, anthropic.ContentTooLargeError), (429, anthropic.RateLimitError),
    (503, anthropic.OverloadedError),
])
def test_the_anthropic_sdk_raises_on_translated_openai_errors(status, error):
    out_status, body = anthropic_error(status, openai_error_body("why"))
    with anthropic_sdk(lambda _: json_response(out_status, body)) as client, \
            pytest.raises(error) as caught:
        client.messages.create(model="llama", max_tokens=8, messages=HI)
    assert "why" in str(caught.value)


def test_each_translation_is_pure():
    """Inputs are not changed in place: the gateway may retry or log them."""
    body = {"model": "gpt-x", "messages": [user([text("a")]), assistant("b"), user("c")],
            "tools": [OA_TOOL], "parallel_tool_calls": False}
    frozen = orjson.dumps(body)
    anthropic_request(body, "claude-x", 10)
    assert orjson.dumps(body) == frozen
    request = {"model": "claude-x", "max_tokens": 5, "tools": [AN_TOOL],
               "messages": [user([result("t", "r"), text("x")])]}
    frozen = orjson.dumps(request)
    openai_request(request, "llama")
    assert orjson.dumps(request) == frozen

