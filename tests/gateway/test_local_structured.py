"""Tool calls and structured outputs from the local engine as ``make run`` serves it, through
the official SDKs on all three APIs, streamed and not.

Every answer must parse and validate (jsonschema) against the schema asked for: tool calls
under ``tool_choice`` "required" and a named function over the τ-bench airline tools, and
``json_schema`` outputs of varied schemas. The prompts are the first user turns of the
τ-bench test conversations (../shared/data/agent_traces), sent concurrently.

By default a cheap sample keeps the suite fast: 4 of the 14 airline tools (~600 prompt
tokens), 2 tool-call prompts per API (between them: required and named, streamed and not)
and one JSON one per API, all 9 requests at once (one batch of the engine). ``STRUCTURED_FULL=1`` runs the whole
check: all 14 tools (~2,600 prompt tokens), 50 tool-call prompts per API and 50 JSON ones
on each API, 4 in flight (slow on a CPU: many minutes; ``STRUCTURED_APIS=chat`` runs one
API's share).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.conftest import LogSink

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "agent_traces"
FULL = os.environ.get("STRUCTURED_FULL") == "1"
PROMPTS = 50 if FULL else 4
APIS = os.environ.get("STRUCTURED_APIS", "chat,messages,responses").split(",")
SHORT = ("get_user_details", "get_reservation_details", "cancel_reservation",
         "search_direct_flight")
NO_CACHE = {"cache-control": "no-cache"}
#: Room for the longest answer the grammar allows: the engine bounds open strings and arrays
#: (local_engine.structured), and the largest airline tool's arguments (book_reservation:
#: 27 strings of up to 64 characters in the worst case) take up to ~2,000 tokens. A smaller
#: budget cuts such an answer (``finish_reason: length``), as OpenAI's does.
MAX_TOKENS = 2048 if FULL else 400

pytestmark = pytest.mark.skipif(not DATA.exists(), reason="../shared/data is not here")


def airline() -> tuple[list[dict[str, Any]], list[str]]:
    tools = json.loads((DATA / "tau_airline_tools.json").read_text())
    if not FULL:
        tools = [t for t in tools if t["function"]["name"] in SHORT]
    lines = (DATA / "tau_airline_test.jsonl").read_text().splitlines()[:PROMPTS]
    return tools, [json.loads(line)["messages"][1]["content"] for line in lines]


TOOLS, USERS = airline()
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
FORMATS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    {"type": "object", "properties": {"city": {"type": "string"},
                                      "days": {"type": "integer", "minimum": 1,
                                               "maximum": 30}},
     "required": ["city", "days"], "additionalProperties": False},
    {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"},
                                                "minItems": 1, "maxItems": 3}},
     "required": ["steps"]},
    {"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "neutral"]},
                                      "score": {"type": "number"}},
     "required": ["mood", "score"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": {"type": "string"}, "vip": {"type": "boolean"}},
        "required": ["name", "vip"]}, "tags": {"type": "array", "items": {
            "type": "string", "enum": ["a", "b"]}}}, "required": ["user", "tags"]},
]


def choice_of(i: int) -> str | None:
    """Even prompts: "required"; odd ones: the function named (None)."""
    return "required" if i % 2 == 0 else None


def streamed(i: int) -> bool:
    """Prompts 1, 2 (mod 4) stream: both tool choices, streamed and not."""
    return i % 4 in (1, 2)


def named(i: int) -> str:
    return TOOLS[i % len(TOOLS)]["function"]["name"]


def valid(name: str, arguments: Any) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])


def test_what_the_engine_cannot_do_is_a_400_in_the_callers_format(
        make_run: tuple[str, LogSink]) -> None:
    url = make_run[0]
    bad = {"type": "object", "properties": {"when": {"type": "string", "format": "moon"}}}
    with openai.OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="smollm2", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": bad}})
        assert info.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="smollm2", input="hi",  # forced: never dropped
                                    tools=[{"type": "web_search_preview"}],
                                    tool_choice={"type": "web_search_preview"})
        assert info.value.body["param"] == "tool_choice"  # type: ignore[index]
    with anthropic.Anthropic(base_url=url, api_key="sk", max_retries=0) as claude:
        with pytest.raises(anthropic.BadRequestError) as err:
            claude.messages.create(model="smollm2", max_tokens=8, messages=[
                {"role": "user", "content": "hi"}], tools=[{"name": "f", "input_schema": bad}],
                tool_choice={"type": "any"})
        assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "moon" in err.value.body["error"]["message"]  # type: ignore[index]


async def chat_call(client: openai.AsyncOpenAI, i: int) -> None:
    kwargs: dict[str, Any] = {
        "model": "smollm2", "max_tokens": MAX_TOKENS, "tools": TOOLS,
        "parallel_tool_calls": False, "extra_headers": NO_CACHE,
        "messages": [{"role": "user", "content": USERS[i]}],
        "tool_choice": choice_of(i) or {"type": "function", "function": {"name": named(i)}}}
    if streamed(i):  # the SDK's own accumulation of the argument deltas
        async with client.chat.completions.stream(**kwargs) as stream:
            final = await stream.get_final_completion()
    else:
        final = await client.chat.completions.create(**kwargs)
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    if choice_of(i) is None:
        assert call.function.name == named(i)
    valid(call.function.name, call.function.arguments)


async def messages_call(client: anthropic.AsyncAnthropic, i: int) -> None:
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    choice = ({"type": "any", "disable_parallel_tool_use": True} if choice_of(i)
              else {"type": "tool", "name": named(i)})
    kwargs: dict[str, Any] = {
        "model": "smollm2", "max_tokens": MAX_TOKENS, "tools": tools, "tool_choice": choice,
        "messages": [{"role": "user", "content": USERS[i]}], "extra_headers": NO_CACHE}
    if streamed(i):
        async with client.messages.stream(**kwargs) as stream:
            message = await stream.get_final_message()
    else:
        message = await client.messages.create(**kwargs)
    assert message.stop_reason == "tool_use", message
    [block] = [b for b in message.content if b.type == "tool_use"]
    if choice_of(i) is None:
        assert block.name == named(i)
    valid(block.name, block.input)


async def responses_call(client: openai.AsyncOpenAI, i: int) -> None:
    tools = [{"type": "function", "name": t["function"]["name"],
              "description": t["function"]["description"],
              "parameters": t["function"]["parameters"], "strict": False} for t in TOOLS]
    kwargs: dict[str, Any] = {
        "model": "smollm2", "max_output_tokens": MAX_TOKENS, "tools": tools,
        "parallel_tool_calls": False, "input": USERS[i], "extra_headers": NO_CACHE,
        "tool_choice": choice_of(i) or {"type": "function", "name": named(i)}}
    if streamed(i):
        events = [e async for e in await client.responses.create(stream=True, **kwargs)]
        assert events[-1].type == "response.completed", events[-1]
        response = events[-1].response  # type: ignore[union-attr]
    else:
        response = await client.responses.create(**kwargs)
    [call] = [item for item in response.output if item.type == "function_call"]
    if choice_of(i) is None:
        assert call.name == named(i)
    valid(call.name, call.arguments)


def ask_json(i: int) -> str:
    return USERS[i % len(USERS)] + "\nAnswer in JSON."


async def chat_json(client: openai.AsyncOpenAI, i: int, schema: dict[str, Any]) -> str:
    kwargs: dict[str, Any] = {
        "model": "smollm2", "max_tokens": MAX_TOKENS, "extra_headers": NO_CACHE,
        "messages": [{"role": "user", "content": ask_json(i)}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "answer", "schema": schema, "strict": False}}}
    if i % 2:
        async with client.chat.completions.stream(**kwargs) as stream:
            final = await stream.get_final_completion()
    else:
        final = await client.chat.completions.create(**kwargs)
    assert final.choices[0].finish_reason == "stop"
    return final.choices[0].message.content or ""


async def messages_json(client: anthropic.AsyncAnthropic, i: int, schema: dict[str, Any]
                        ) -> str:
    kwargs: dict[str, Any] = {
        "model": "smollm2", "max_tokens": MAX_TOKENS, "extra_headers": NO_CACHE,
        "messages": [{"role": "user", "content": ask_json(i)}],
        "extra_body": {"output_config": {"format": {"type": "json_schema", "schema": schema}}}}
    if i % 2:
        async with client.messages.stream(**kwargs) as stream:
            message = await stream.get_final_message()
    else:
        message = await client.messages.create(**kwargs)
    assert message.stop_reason == "end_turn"
    return "".join(b.text for b in message.content if b.type == "text")


async def responses_json(client: openai.AsyncOpenAI, i: int, schema: dict[str, Any]) -> str:
    kwargs: dict[str, Any] = {
        "model": "smollm2", "max_output_tokens": MAX_TOKENS, "extra_headers": NO_CACHE,
        "input": ask_json(i), "text": {"format": {
            "type": "json_schema", "name": "answer", "schema": schema, "strict": False}}}
    if i % 2:
        events = [e async for e in await client.responses.create(stream=True, **kwargs)]
        assert events[-1].type == "response.completed", events[-1]
        return str(events[-1].response.output_text)  # type: ignore[union-attr]
    response = await client.responses.create(**kwargs)
    assert response.status == "completed"
    return response.output_text


def test_tool_calls_and_json_schema_outputs_validate_on_all_three_apis(
        make_run: tuple[str, LogSink]) -> None:
    """Tool calls: prompt i, ``choice_of(i)``, ``streamed(i)``. JSON: prompt n, schema
    ``FORMATS[n % 5]``, odd n streamed. All at once; every failure reported."""
    url = make_run[0]
    json_prompts = 50 // len(APIS) + 1 if FULL else 1

    async def main() -> list[tuple[str, BaseException | None]]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk",
                                      max_retries=0) as oai, \
                anthropic.AsyncAnthropic(base_url=url, api_key="sk", max_retries=0) as ant:

            async def checked(api: str, i: int, schema: dict[str, Any]) -> None:
                ask = {"chat": chat_json, "messages": messages_json, "responses":
                       responses_json}[api]
                text = await ask(oai if api != "messages" else ant, i, schema)  # type: ignore[operator]
                jsonschema.validate(json.loads(text), schema)

            calls = {"chat": lambda i: chat_call(oai, i),
                     "messages": lambda i: messages_call(ant, i),
                     "responses": lambda i: responses_call(oai, i)}
            if FULL:  # the long tools prompt prefilled once per API, then read from cache
                for api in APIS:  # (prompt 0 is among the jobs: its outcome counts there)
                    with contextlib.suppress(Exception):
                        await calls[api](0)
            jobs: dict[str, Any] = {}
            # the sample: 2 prompts an API, each API both choices, streamed and not
            picks = dict.fromkeys(APIS, range(len(USERS))) if FULL else {
                "chat": (0, 1), "messages": (2, 3), "responses": (0, 1)}
            for api, indices in picks.items():
                for i in indices:
                    jobs[f"{api} tools {i}"] = calls[api](i)
            for j in range(json_prompts):
                for k, api in enumerate(("chat", "messages", "responses")):
                    n = 3 * j + k  # the sample: chat plain, messages streamed, responses plain
                    if api in APIS:
                        jobs[f"{api} json {n}"] = checked(api, n, FORMATS[n % len(FORMATS)])
            # a few in flight: on a CPU a queue of hundreds waits past the read timeout
            slots = asyncio.Semaphore(4)

            async def limited(job: Any) -> None:
                async with slots:
                    await job

            done = await asyncio.gather(*(limited(j) for j in jobs.values()),
                                        return_exceptions=True)
            return [(name, e if isinstance(e, BaseException) else None)
                    for name, e in zip(jobs, done, strict=True)]

    results = asyncio.run(main())
    failed = [f"{name}: {e!r}"[:300] for name, e in results if e is not None]
    print(f"{len(results) - len(failed)} of {len(results)} answers valid")
    assert not failed, f"{len(failed)} of {len(results)} failed:\n" + "\n".join(failed)


def test_a_responses_function_tool_round_trip_on_the_local_engine(
        make_run: tuple[str, LogSink]) -> None:
    """Turn 1 (streamed, greedy, room for the longest string the grammar allows: a sampled
    argument may ramble to its bound, and an answer cut at max_output_tokens ends
    ``response.incomplete``, which the SDK's get_final_response refuses): a named function's
    call, its arguments valid. Turn 2 chains it
    with ``previous_response_id`` and gives the call's output: the engine answers in text,
    and the chain's items are the call and its output."""
    url = make_run[0]
    weather = {"type": "function", "name": "get_weather", "description": "Today's weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"], "additionalProperties": False}}
    with openai.OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0) as client:
        with client.responses.stream(
                model="smollm2", input="What is the weather in Paris?", tools=[weather],
                tool_choice={"type": "function", "name": "get_weather"},
                temperature=0, max_output_tokens=128, extra_headers=NO_CACHE) as stream:
            first = stream.get_final_response()
        [call] = [item for item in first.output if item.type == "function_call"]
        assert call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), weather["parameters"])
        second = client.responses.create(
            model="smollm2", previous_response_id=first.id, tools=[weather],
            tool_choice="none", max_output_tokens=16, extra_headers=NO_CACHE,
            input=[{"type": "function_call_output", "call_id": call.call_id,
                    "output": "Sunny, 21 C"}])
        assert second.status in ("completed", "incomplete") and second.output_text
        items = client.responses.input_items.list(second.id, order="asc").data
        assert [i.type for i in items][-2:] == ["function_call", "function_call_output"]
