"""What the tests of both translation directions share (test_openai_to_anthropic*.py,
test_anthropic_to_openai*.py): the official SDKs as judges (their request types, response
models, clients and stream accumulators) and the builders the bodies are written with."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import openai
import orjson
from anthropic.lib.streaming import MessageStream
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.message_create_params import (
    MessageCreateParamsBase,
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from openai.lib.streaming.chat import ChatCompletionStream
from openai.types.chat import ChatCompletionChunk, ParsedChatCompletion
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsBase,
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter

from gateway.formats import anthropic_to_openai, openai_to_anthropic
from gateway.formats.translator import Translator

HI = [{"role": "user", "content": "hi"}]
PNG = "iVBORw0KGgo="
PDF = "JVBERi0xLjQK"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}
OA_TOOL = {"type": "function", "function": {"name": "weather", "description": "Weather now",
                                            "parameters": WEATHER}}
AN_TOOL = {"name": "weather", "description": "Weather now", "input_schema": WEATHER}
BREAK = {"prompt_cache_breakpoint": {"mode": "explicit"}}
EPHEMERAL = {"cache_control": {"type": "ephemeral"}}


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


# --- bodies ---------------------------------------------------------------------------------

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


def completion(message: dict[str, Any], finish: str | None = "stop",
               **fields: Any) -> bytes:
    return orjson.dumps({"id": "chatcmpl-abc123", "object": "chat.completion",
                         "created": 1, "model": "llama-3",
                         "choices": [{"index": 0, "message": {"role": "assistant", **message},
                                      "logprobs": None, "finish_reason": finish}],
                         **fields})


USAGE = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25,
         "prompt_tokens_details": {"cached_tokens": 8}}


def message_body(content: list[dict[str, Any]], stop: str | None = "end_turn",
                 **fields: Any) -> bytes:
    return orjson.dumps({"id": "msg_01XYZ", "type": "message", "role": "assistant",
                         "model": "claude-x", "content": content, "stop_reason": stop,
                         "stop_sequence": None, **fields})


def anthropic_error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message},
                         "request_id": "req_1"})


def openai_error_body(message: str, type_: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None,
                                   "code": None}})


# --- the whole-answer translators as dispatch drives them ------------------------------------
# The upstream's body parsed once (None when it is not JSON), the translation serialised.

def parsed(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def openai_response(body: bytes, model: str | None = None) -> bytes:
    return orjson.dumps(openai_to_anthropic.openai_response(parsed(body), model))


def openai_error(status: int, body: bytes) -> bytes:
    return orjson.dumps(openai_to_anthropic.openai_error(status, parsed(body)))


def anthropic_response(body: bytes, model: str | None = None) -> bytes:
    return orjson.dumps(anthropic_to_openai.anthropic_response(parsed(body), model))


def anthropic_error(status: int, body: bytes) -> tuple[int, bytes]:
    status, error = anthropic_to_openai.anthropic_error(status, parsed(body))
    return status, orjson.dumps(error)


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


# --- streams --------------------------------------------------------------------------------

def run(translator: Translator, stream: bytes, step: int | None = None) -> bytes:
    """All of ``stream`` through ``translator``, ``step`` bytes at a time (None: at once)."""
    step = step or len(stream)
    out = b"".join(translator.feed(stream[i:i + step]) for i in range(0, len(stream), step))
    return out + translator.flush()


def response(body: bytes) -> httpx2.Response:
    return httpx2.Response(200, content=body, request=httpx2.Request("POST", "http://up/v1"))


def openai_final(body: bytes) -> ParsedChatCompletion[None]:
    with openai.OpenAI(api_key="k") as client:
        raw = openai.Stream(cast_to=ChatCompletionChunk, response=response(body), client=client)
        return ChatCompletionStream(raw_stream=raw, response_format=openai.omit,
                                    input_tools=openai.omit).get_final_completion()


def anthropic_final(body: bytes) -> Message:
    with anthropic.Anthropic(api_key="k") as client:
        raw = anthropic.Stream(cast_to=RawMessageStreamEvent, response=response(body),
                               client=client)  # type: ignore[arg-type]
        return MessageStream(raw, anthropic.NOT_GIVEN).get_final_message()
