"""A streamed chat answer calling namespaced and custom tools, as Responses events: each
event one the openai SDK parses, the calls named as the request declared them (a
``namespace``, a ``custom_tool_call`` whose text streams as ``custom_tool_call_input``
events), and the SDK's stream helper accumulating the same response as the answer's last
event; an Anthropic upstream's stream likewise."""

from __future__ import annotations

import json
from typing import Any

import orjson
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.formats.responses_stream import StreamObserver
from gateway.formats.responses_to_anthropic import ResponsesToAnthropic
from gateway.formats.responses_to_openai.stream import ResponsesStreamFromChat
from gateway.formats.translator import Translator
from llm_wire.sse import EventReader

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello \"world\"\n*** End Patch\n"
REQUEST: dict[str, Any] = {"model": "m", "input": "hi", "tools": [
    {"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
    {"type": "namespace", "name": "mcp__fs", "description": "Files.", "tools": [
        {"type": "function", "name": "read", "parameters": {"type": "object"}}]},
]}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
    event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
             "model": "m", "choices": [] if delta is None else [
                 {"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def call(index: int, arguments: str, cid: str | None = None, name: str | None = None
         ) -> bytes:
    fn: dict[str, Any] = {"arguments": arguments}
    head: dict[str, Any] = {"index": index}
    if cid is not None:
        head.update({"id": cid, "type": "function"})
        fn["name"] = name
    return chunk({"tool_calls": [{**head, "function": fn}]})


def events(translator: Translator, raw: bytes, pieces: int = 9) -> list[Any]:
    out = b"".join(translator.feed(raw[i:i + pieces]) for i in range(0, len(raw), pieces))
    out += translator.flush()
    assert translator.done
    observer = StreamObserver()
    observer.feed(out)
    assert observer.finish_reason == "tool_calls"
    parsed = []
    for name, data in EventReader().feed(out):
        event = EVENTS.validate_python(orjson.loads(data))
        assert event.type == name
        parsed.append(event)
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    return parsed


def accumulated(parsed: list[Any]) -> Any:
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in parsed:
        snapshot = state.handle_event(event)
    return snapshot[-1].response


def test_calls_stream_named_as_declared_and_custom_text_as_its_own_events() -> None:
    arguments = json.dumps({"input": PATCH})
    raw = (chunk({"role": "assistant", "content": ""})
           + call(0, "", "call_p", "apply_patch")
           + b"".join(call(0, arguments[i:i + 6]) for i in range(0, len(arguments), 6))
           + call(1, '{"path":', "call_r", "mcp__fs__read") + call(1, '"a.txt"}')
           + chunk({}, "tool_calls") + b"data: [DONE]\n\n")
    parsed = events(ResponsesStreamFromChat(REQUEST), raw)
    kinds = [e.type for e in parsed]
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    deltas = [e.delta for e in parsed if e.type == "response.custom_tool_call_input.delta"]
    assert len(deltas) > 3 and "".join(deltas) == PATCH  # as it came, not at the end
    [done] = [e for e in parsed if e.type == "response.custom_tool_call_input.done"]
    assert done.input == PATCH
    assert kinds.index("response.custom_tool_call_input.done") < kinds.index(
        "response.function_call_arguments.delta")
    added = [e.item for e in parsed if e.type == "response.output_item.added"]
    assert [(i.type, i.name, i.namespace) for i in added] == [
        ("custom_tool_call", "apply_patch", None), ("function_call", "read", "mcp__fs")]
    assert "response.function_call_arguments.delta" not in kinds[:kinds.index(
        "response.custom_tool_call_input.done")]  # a custom call has no arguments events
    final = parsed[-1].response
    assert final.status == "completed"
    patch, read = final.output
    assert (patch.type, patch.call_id, patch.name, patch.input) == (
        "custom_tool_call", "call_p", "apply_patch", PATCH)
    assert (read.type, read.name, read.namespace, read.arguments) == (
        "function_call", "read", "mcp__fs", '{"path":"a.txt"}')
    assert [item.model_dump(exclude={"parsed_arguments"}) for item in
            accumulated(parsed).output] == [item.model_dump() for item in final.output]


def test_a_custom_call_whose_arguments_are_not_its_object_gives_its_text_at_the_end() -> None:
    raw = (call(0, "", "c", "apply_patch") + call(0, "*** Begin")
           + call(0, " Patch") + chunk({}, "tool_calls") + b"data: [DONE]\n\n")
    parsed = events(ResponsesStreamFromChat(REQUEST), raw)
    deltas = [e.delta for e in parsed if e.type == "response.custom_tool_call_input.delta"]
    assert deltas == ["*** Begin Patch"]
    assert parsed[-1].response.output[0].input == "*** Begin Patch"


def anthropic_event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **fields}) \
        + b"\n\n"


def test_an_anthropic_streams_calls_come_back_named_as_declared() -> None:
    arguments = json.dumps({"input": PATCH})
    raw = (anthropic_event("message_start", message={
               "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 9, "output_tokens": 1}})
           + anthropic_event("content_block_start", index=0, content_block={
               "type": "tool_use", "id": "toolu_1", "name": "apply_patch", "input": {}})
           + b"".join(anthropic_event("content_block_delta", index=0, delta={
               "type": "input_json_delta", "partial_json": arguments[i:i + 10]})
               for i in range(0, len(arguments), 10))
           + anthropic_event("content_block_stop", index=0)
           + anthropic_event("content_block_start", index=1, content_block={
               "type": "tool_use", "id": "toolu_2", "name": "mcp__fs__read", "input": {}})
           + anthropic_event("content_block_delta", index=1, delta={
               "type": "input_json_delta", "partial_json": '{"path": "a"}'})
           + anthropic_event("content_block_stop", index=1)
           + anthropic_event("message_delta", delta={"stop_reason": "tool_use",
                                                     "stop_sequence": None},
                             usage={"output_tokens": 30})
           + anthropic_event("message_stop"))
    parsed = events(ResponsesToAnthropic().stream(REQUEST), raw)
    deltas = [e.delta for e in parsed if e.type == "response.custom_tool_call_input.delta"]
    assert len(deltas) > 1 and "".join(deltas) == PATCH
    patch, read = parsed[-1].response.output
    assert (patch.type, patch.call_id, patch.input) == ("custom_tool_call", "toolu_1", PATCH)
    assert (read.name, read.namespace, orjson.loads(read.arguments)) == (
        "read", "mcp__fs", {"path": "a"})
