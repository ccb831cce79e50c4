"""An Anthropic client calling an OpenAI-compatible upstream, whole answers: the Messages
request as a Chat Completions request (one row per mapping rule and per unsupported
feature), the upstream's answers and errors as Anthropic's; translated requests checked
against the SDKs' own request types, translated answers parsed by the SDKs' own models and
clients; round trips."""

from __future__ import annotations

import re
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from anthropic.types import Message
from anthropic.types.shared.error_response import ErrorResponse

from gateway.errors import InvalidRequest, UpstreamError
from gateway.formats.anthropic_to_openai import openai_request
from gateway.formats.openai_to_anthropic import anthropic_request
from tests.gateway.formats.claude_code import (
    folds_system_messages,
    lowers_max_tokens,
    prompt_too_long,
)
from tests.gateway.formats.translation import (
    AN_TOOL,
    EPHEMERAL,
    HI,
    OA_TOOL,
    PDF,
    PNG,
    USAGE,
    WEATHER,
    anthropic_error,
    anthropic_response,
    anthropic_sdk,
    assistant,
    call,
    check_anthropic,
    check_openai,
    completion,
    json_response,
    openai_error_body,
    openai_response,
    result,
    text,
    tool_msg,
    use,
    user,
)


def to_openai(messages: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    body = {"model": "claude-x", "max_tokens": 256, "messages": messages or HI, **fields}
    out = openai_request(body, "llama")
    check_openai(out)
    return out


# --- requests -------------------------------------------------------------------------------

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
    # Claude Code's, under its mid-conversation-system beta: after the tool results, last
    pytest.param({"system": [text("You are Claude Code.", **EPHEMERAL)], "messages": [
        user("Fix it"), assistant([use("toolu_1", "weather", {"city": "Paris"})]),
        user([result("toolu_1", "18C"), text("go on", **EPHEMERAL)]),
        {"role": "system", "content": [text("Plan mode is on."), text("Be terse.")]}]},
                 {"messages": [{"role": "system", "content": "You are Claude Code."},
                               user("Fix it"),
                               {"role": "assistant", "content": None, "tool_calls": [
                                   call("toolu_1", "weather", '{"city":"Paris"}')]},
                               tool_msg("toolu_1", "18C"), user("go on"),
                               {"role": "system", "content": "Plan mode is on.\n\nBe terse."}]},
                 id="a-system-message-after-tool-results-in-place"),
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
    # What Claude Code sends by default: how much to think and show, how the server trims
    # the context. The model answers the same conversation without them.
    pytest.param({"thinking": {"type": "adaptive", "display": "summarized"},
                  "output_config": {"effort": "medium"},
                  "context_management": {"edits": [{"type": "clear_thinking_20251015"}]}},
                 {"messages": [user("hi")], "max_tokens": 256, "reasoning_effort": None},
                 id="thinking-effort-and-context-management-dropped"),
    pytest.param({"thinking": {"type": "enabled", "budget_tokens": 2048}},
                 {"messages": [user("hi")], "max_tokens": 256}, id="thinking-budget-dropped"),
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
    ({"container": "c-1"}, "container", "'container'"),
    ({"mcp_servers": [{"type": "url", "url": "https://m.test", "name": "m"}]}, "mcp_servers",
     "'mcp_servers'"),
    ({"inference_geo": "us"}, "inference_geo", "'inference_geo'"),
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


# --- answers --------------------------------------------------------------------------------

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


# --- errors ---------------------------------------------------------------------------------

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


@pytest.mark.parametrize("said", [
    "System message must be at the beginning.",  # Qwen3's chat template, through vLLM
    ("Only user and assistant roles are supported, with the exception of an initial "
     "optional system message!"),  # Mistral's
    "role 'system' is not supported on this model",
])
def test_an_upstream_refusing_a_system_message_where_it_sits_is_refused_in_anthropics_words(
        said):
    for body in (openai_error_body(said), orjson.dumps({"object": "error", "message": said})):
        status, raw = anthropic_error(400, body)
        message = orjson.loads(raw)["error"]["message"]
        assert message.startswith('messages: Unexpected role "system". The Messages API '
                                  "accepts a top-level `system` parameter")
        assert said in message  # the upstream's own words kept
        assert folds_system_messages(status, raw)  # Claude Code folds them and retries


#: Context overflows in OpenAI-compatible servers' words.
OPENAI_OVERFLOW = ("This model's maximum context length is 32768 tokens. However, you requested "
                   "40000 tokens (8000 in the messages, 32000 in the completion). Please "
                   "reduce the length of the messages or completion.")
OPENAI_PROMPT = ("This model's maximum context length is 8192 tokens. However, you requested "
                 "12000 tokens (10000 in the messages, 2000 in the completion).")
OPENAI_OLD = ("This model's maximum context length is 128000 tokens. However, your messages "
              "resulted in 130000 tokens. Please reduce the length of the messages.")
VLLM_MAX = ("'max_tokens' or 'max_completion_tokens' is too large: 32000. This model's "
            "maximum context length is 32768 tokens and your request has 1200 input tokens "
            "(32000 > 32768 - 1200). None")
VLLM_PROMPT = ("This model's maximum context length is 32768 tokens. However, your request "
               "has 40000 input tokens. Please reduce the length of the input messages.")
SGLANG = ("Requested token count exceeds the model's maximum context length of 32768 tokens. "
          "You requested a total of 33000 tokens: 1000 tokens from the input messages and "
          "32000 tokens for the completion. Please reduce the number of tokens in the input "
          "messages or the completion to fit within the limit.")
LOCAL = "the prompt has 9000 tokens; this model's context length is 8192"


@pytest.mark.parametrize(("said", "too_long", "lower"), [
    (OPENAI_OVERFLOW, None, (8000, 32000, 32768)),  # OpenAI, and vLLM before 0.6
    (OPENAI_PROMPT, (10000, 8192), None),
    (OPENAI_OLD, (130000, 128000), None),
    (VLLM_MAX, None, (1200, 32000, 32768)),
    (VLLM_PROMPT, (40000, 32768), None),
    (SGLANG, None, (1000, 32000, 32768)),
    (LOCAL, (9000, 8192), None),
])
def test_a_context_overflow_is_told_in_anthropics_words_for_the_clients_recovery(
        said, too_long, lower):
    """Claude Code compacts on "prompt is too long: N tokens > L maximum" and lowers
    max_tokens on "input length and `max_tokens` exceed context limit: N + M > L"."""
    status, raw = anthropic_error(400, openai_error_body(said))
    assert said in orjson.loads(raw)["error"]["message"]
    assert (prompt_too_long(status, raw), lowers_max_tokens(status, raw)) == (too_long, lower)


@pytest.mark.parametrize(("status", "said"), [
    (400, "Conversation roles must alternate user/assistant/user/assistant"),
    (400, "'messages[0].content': system prompt must be a string"),
    (500, "System message must be at the beginning."),
])
def test_other_upstream_errors_keep_their_words(status, said):
    out_status, raw = anthropic_error(status, openai_error_body(said))
    assert orjson.loads(raw)["error"]["message"] == said
    assert not folds_system_messages(out_status, raw)


# --- the anthropic SDK, answered by translated bodies ---------------------------------------

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


def test_the_translation_is_pure():
    """Inputs are not changed in place: the gateway may retry or log them."""
    request = {"model": "claude-x", "max_tokens": 5, "tools": [AN_TOOL],
               "messages": [user([result("t", "r"), text("x")])]}
    frozen = orjson.dumps(request)
    openai_request(request, "llama")
    assert orjson.dumps(request) == frozen
