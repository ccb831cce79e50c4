"""An OpenAI client calling a Gemini upstream, translation alone (pure functions, no server):
the request as generateContent takes it, schemas in Gemini's subset, whole answers, Google's
errors, and a recorded-shape event stream cut anywhere."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.formats.gemini import openai_error
from gateway.formats.openai_to_gemini import (
    OpenAIStreamFromGemini,
    gemini_request,
    openai_response,
)
from gateway.formats.openai_to_gemini.schema import gemini_schema
from gateway.testing.gemini_answers import validate_request


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "gem", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_a_conversation_becomes_contents_with_the_system_instruction_apart():
    body = chat(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {
            "type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"a":1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"t": 2}'}],
        stop="END", top_p=0.5, seed=3, max_completion_tokens=9)
    out = gemini_request(body, "gemini-2.5-flash")
    assert list(out) == ["model", "systemInstruction", "contents", "generationConfig"]
    assert out["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert out["contents"] == [
        {"role": "user", "parts": [{"text": "look"}, {"inlineData": {
            "mimeType": "image/png", "data": "iVBORw=="}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}},
                                    {"functionCall": {"name": "g", "args": {"a": 1}}}]},
        {"role": "user", "parts": [  # both results in one turn, each named by its call
            {"functionResponse": {"name": "f", "response": {"result": "sunny"}}},
            {"functionResponse": {"name": "g", "response": {"t": 2}}}]}]
    assert out["generationConfig"] == {"maxOutputTokens": 9, "topP": 0.5, "seed": 3,
                                       "stopSequences": ["END"]}
    validate_request({k: v for k, v in out.items() if k != "model"})  # as Google parses it


@pytest.mark.parametrize(("field", "value", "code"), [
    ("n", 2, "unsupported_value"), ("logprobs", True, "unsupported_value"),
    ("reasoning_effort", "low", "unsupported_parameter"),
    ("audio", {"voice": "x"}, "unsupported_parameter")])
def test_what_gemini_cannot_do_is_a_400_naming_it(field, value, code):
    with pytest.raises(InvalidRequest) as caught:
        gemini_request(chat(**{field: value}), "g")
    assert (caught.value.param, caught.value.code) == (field, code)


def test_a_tool_result_without_its_call_is_a_400():
    with pytest.raises(InvalidRequest, match="answers no earlier tool call"):
        gemini_request(chat(messages=[{"role": "tool", "tool_call_id": "x", "content": "1"}]),
                       "g")


def test_json_schemas_become_geminis_subset():
    schema = {"$defs": {"City": {"type": "object", "properties": {"name": {"const": "x"}},
                                 "additionalProperties": False}},
              "type": "object", "properties": {
                  "city": {"$ref": "#/$defs/City"},
                  "tags": {"type": "array", "items": {"type": ["string", "null"]}},
                  "pick": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}},
              "required": ["city"], "additionalProperties": False, "$schema": "x"}
    assert gemini_schema(schema, "p") == {
        "required": ["city"], "type": "OBJECT", "properties": {
            "city": {"type": "OBJECT", "properties": {"name": {"enum": ["x"],
                                                               "type": "STRING"}}},
            "tags": {"type": "ARRAY", "items": {"nullable": True, "type": "STRING"}},
            "pick": {"anyOf": [{"type": "INTEGER"}, {"type": "BOOLEAN"}]}}}
    with pytest.raises(InvalidRequest):
        gemini_schema({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}, "p")


def test_an_answer_with_text_thoughts_calls_and_cached_usage():
    answer = {"responseId": "r1", "modelVersion": "gemini-2.5-flash", "candidates": [{
        "content": {"role": "model", "parts": [{"text": "plan", "thought": True},
                                               {"text": "Hello"},
                                               {"functionCall": {"name": "f", "args": {"a": 1}}}]},
        "finishReason": "STOP"}], "usageMetadata": {
        "promptTokenCount": 2000, "cachedContentTokenCount": 1500,
        "candidatesTokenCount": 5, "thoughtsTokenCount": 7}}
    out = openai_response(answer)
    message = out["choices"][0]["message"]
    assert (message["content"], out["choices"][0]["finish_reason"]) == ("Hello", "tool_calls")
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert out["usage"] == {"prompt_tokens": 2000, "completion_tokens": 12,
                            "total_tokens": 2012, "prompt_tokens_details": {"cached_tokens": 1500},
                            "completion_tokens_details": {"reasoning_tokens": 7}}


@pytest.mark.parametrize(("status", "error", "expected"), [
    (429, {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"},
     (429, "rate_limit_error")),
    (503, {"code": 503, "message": "busy", "status": "UNAVAILABLE"}, (503, "overloaded_error")),
    (400, {"code": 400, "message": "API key not valid", "status": "INVALID_ARGUMENT",
           "details": [{"reason": "API_KEY_INVALID"}]}, (401, "authentication_error")),
    (500, None, (500, "server_error"))])
def test_googles_errors_read_as_openais(status, error, expected):
    out_status, body = openai_error(status, {"error": error} if error else None)
    assert (out_status, body["error"]["type"]) == expected


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\r\n\r\n"


def test_a_stream_cut_anywhere_becomes_chunks_ending_in_done():
    events = [_sse({"responseId": "r", "modelVersion": "m", "candidates": [{"content": {
        "role": "model", "parts": [{"text": w}]}, "index": 0}]}) for w in ("Hel", "lo")]
    events.append(_sse({"responseId": "r", "modelVersion": "m", "candidates": [{
        "content": {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
        "finishReason": "STOP", "index": 0}], "usageMetadata": {
        "promptTokenCount": 3, "candidatesTokenCount": 2}}))
    raw = b"".join(events)
    translator = OpenAIStreamFromGemini(created=1)
    out = b"".join(translator.feed(raw[i:i + 7]) for i in range(0, len(raw), 7))
    out += translator.flush()
    chunks = [orjson.loads(line[6:]) for line in out.split(b"\n\n") if line.startswith(b"data: {")]
    assert translator.done and out.endswith(b"data: [DONE]\n\n")
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[1:3] == [{"content": "Hel"}, {"content": "lo"}]
    assert deltas[3]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["total_tokens"] == 5


def test_a_stream_that_ends_without_a_finish_gets_no_terminator():
    translator = OpenAIStreamFromGemini()
    translator.feed(_sse({"candidates": [{"content": {"parts": [{"text": "a"}]}}]}))
    assert translator.flush() == b"" and not translator.done
