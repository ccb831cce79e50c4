"""The fake OpenAI upstream's Responses API: ``/v1/responses`` served natively, with state.

:class:`FakeResponses` is what :class:`~gateway.testing.fake_upstream.FakeUpstream` hands
``.../responses`` paths to, after its common steering (``x-fake-ttft-ms``, ``x-fake-hold``,
``x-fake-status``, ``x-fake-fail-times``), so an upstream that serves ``/v1/responses``
itself can be tested without OpenAI:

- ``POST /responses``: a ``response`` object (one ``message`` output item with an
  ``output_text`` part, or a ``function_call`` item; usage in input/output tokens), or with
  ``"stream": true`` its typed SSE events in order, each with its ``sequence_number`` and
  ``event:`` line: ``response.created``, ``response.in_progress``,
  ``response.output_item.added``, ``response.content_part.added``,
  ``response.output_text.delta`` (one per piece), ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``, then
  ``response.completed`` (``response.incomplete`` with ``x-fake-finish: length``). A
  function call streams ``response.output_item.added`` (a ``function_call`` item),
  ``response.function_call_arguments.delta``/``.done`` and ``response.output_item.done``.
- State: a response is kept unless the request says ``"store": false``; a request naming a
  kept one as ``previous_response_id`` continues its conversation (the usage counts it, and
  ``x-fake-tool: once`` sees its tool results); an unknown id is OpenAI's 400
  ``previous_response_not_found``. ``GET /responses/{id}`` and
  ``GET /responses/{id}/input_items`` read a kept response, ``DELETE /responses/{id}``
  forgets it; an unknown id there is a 404.

Steering headers (the module docstring of ``fake_upstream`` has the whole table):
``x-fake-tokens`` (text pieces), ``x-fake-itl-ms`` (gap between streamed deltas), the late
first delta and stalls of :mod:`gateway.testing.fake_stalls`,
``x-fake-die-after`` (drop the connection after N deltas), ``x-fake-finish`` (``length``:
status ``incomplete``), ``x-fake-usage: 0`` (usage null), ``x-fake-tool`` (call the first
function tool with ``{"x": 1}``, or ``x-fake-tool-args``; ``once``: only while the
conversation holds no ``function_call_output``; ``agent``: a client's own tool, function or
custom, namespaced or not, with valid arguments, once: :mod:`gateway.testing.tool_args`).
A custom tool's call streams ``response.custom_tool_call_input.delta``/``.done``.

Usage: input tokens are the words of the instructions and the conversation; with
``FakeUpstream(simulate_cache=True)``, tokens and ``cached_tokens`` from the simulated OpenAI
prompt cache, as chat's (the instructions and items read as a chat body's messages).

Structured outputs: with ``text.format.type == "json_schema"`` the text is
:func:`json_instance` of the schema, so an SDK's ``output_parsed`` works; the chat side uses
the same for ``response_format``.

Wire format: https://platform.openai.com/docs/api-reference/responses and the ``openai``
SDK's ``openai.types.responses`` (``Response``, ``Response*Event``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.testing.cache_sim import CacheSims
from gateway.testing.fake_stalls import COMMENT_PING, Stalls
from gateway.testing.tool_args import responses_call
from gateway.types import Message, Send

__all__ = ["FakeResponses", "Recorded", "json_instance", "schema_of", "text_pieces",
           "wait_or_left"]

#: Values for JSON Schema ``format``s a parser checks (pydantic's datetime, date, ...).
_FORMATS = {"date-time": "1970-01-01T00:00:00Z", "date": "1970-01-01", "time": "00:00:00",
            "email": "a@example.com", "uri": "https://example.com", "uuid": str(uuid.UUID(int=0)),
            "duration": "P0D"}


#: The fields of input and output items whose words count as input tokens.
_WORDY = frozenset({"content", "text", "output", "arguments"})


class Recorded(Protocol):
    """A request's record (``fake_upstream.Record``): what it reads and what it notes."""

    method: str
    first_byte: float | None
    chunks_sent: int


async def wait_or_left(event: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``event`` (the client left) is set first; True when it was."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


def json_instance(schema: Any, root: Any = None) -> Any:
    """A minimal JSON instance of a JSON Schema: every declared property, each with a value
    of its type (``""``, ``0``, ``False``, ``[]`` or ``min_items`` of them, ``None``),
    ``enum``/``const`` first value, the first branch of ``anyOf``/``oneOf``, ``$ref`` into
    ``$defs``/``definitions``, ``minimum``/``minLength`` respected. Enough for the schemas
    SDKs derive from pydantic models (``client.responses.parse``/``chat...parse``). A schema
    it cannot read (a fuzzed one: a string for ``properties``, a cycle of ``$ref``s, a
    ``minLength`` of 10**30) gives None."""
    try:
        return _instance(schema, schema if root is None else root)
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, MemoryError,
            RecursionError):
        return None


def _instance(schema: Any, root: Any) -> Any:
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        target: Any = root
        for part in str(schema["$ref"]).lstrip("#/").split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _instance(target, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _instance(schema[key][0], root)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties")
        return {name: _instance(sub, root) for name, sub in (
            properties.items() if isinstance(properties, dict) else ())}
    if kind == "array":
        return [_instance(schema.get("items"), root)] * int(schema.get("minItems", 0))
    if kind == "string":
        return _FORMATS.get(schema.get("format", ""), "x" * int(schema.get("minLength", 0)))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        return int(low) if kind == "integer" else float(low)
    return False if kind == "boolean" else None


def text_pieces(n: int, schema: Any = None) -> list[str]:
    """The fake's answer as the pieces it streams: ``"w0 ", "w1 ", ..., "w{n-1}"``; with a
    JSON Schema, :func:`json_instance` serialised, cut into at most ``n`` pieces."""
    if schema is None:
        return [f"w{i} " if i < n - 1 else f"w{i}" for i in range(n)]
    text = orjson.dumps(json_instance(schema)).decode()
    size = -(-len(text) // max(1, n))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _words(obj: Any) -> int:
    """Input tokens, as the fake counts them: the words of every string in ``obj``."""
    if isinstance(obj, str):
        return len(obj.split())
    if isinstance(obj, dict):
        return sum(_words(v) for k, v in obj.items() if k in _WORDY)
    return sum(_words(v) for v in obj) if isinstance(obj, list) else 0


def _items(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``input`` as items, each with an id and a type, as OpenAI keeps them."""
    raw = data.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw or []
    out = []
    for given in items:
        if not isinstance(given, dict):
            continue
        item: dict[str, Any] = {"type": "message", **given}
        if item["type"] == "message" and isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
        out.append({"id": _id(prefix.get(item["type"], "item")), "status": "completed",
                    **item})
    return out


def _as_chat(data: dict[str, Any], conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """The request as the cache simulator reads a chat body: its tools, the instructions,
    then each item of the conversation (as sent, less the ids the fake gave it)."""
    head = [{"role": "system", "content": data["instructions"]}] \
        if isinstance(data.get("instructions"), str) else []
    return {**{k: data[k] for k in ("tools", "prompt_cache_key", "prompt_cache_retention")
               if k in data}, "messages": [*head, *({
                   "role": item.get("role") or item.get("type"), "content": orjson.dumps(
                       {k: v for k, v in item.items() if k not in ("id", "status")}).decode()}
                   for item in conversation)]}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _error(message: str, param: str | None = None, code: str | None = None
           ) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}


@dataclass
class _Kept:
    response: dict[str, Any]
    #: This response's own input items (``input_items``).
    items: list[dict[str, Any]]
    #: The whole conversation it answered, its output included (what a next turn continues).
    conversation: list[dict[str, Any]]


class FakeResponses:
    """The ``/responses`` routes, with the responses kept (module docstring)."""

    def __init__(self) -> None:
        self.kept: dict[str, _Kept] = {}

    def clear(self) -> None:
        self.kept.clear()

    async def __call__(self, path: str, headers: dict[str, str], data: Any,
                       rec: Recorded, disconnected: asyncio.Event, send: Send,
                       touch: Callable[[], None] = lambda: None,
                       sims: CacheSims | None = None) -> None:
        """Answer one request; ``touch`` is called after each streamed delta (a test may be
        waiting on ``Record.chunks_sent``); ``sims``: the usage's input and cached tokens
        from OpenAI's simulated prompt cache (else a word count, nothing cached)."""
        rid, _, sub = path.rpartition("/responses")[2].strip("/").partition("/")
        if not rid:
            if rec.method != "POST" or not isinstance(data, dict):
                await _send(send, 400, _error("Expected a JSON object body."), rec)
                return
            await self._create(headers, data, rec, disconnected, send, touch, sims)
            return
        kept = self.kept.get(rid)
        if kept is None or (sub and sub != "input_items"):
            await _send(send, 404, _error(f"Response with id '{rid}' not found."), rec)
        elif rec.method == "DELETE" and not sub:
            del self.kept[rid]
            await _send(send, 200, {"id": rid, "object": "response", "deleted": True}, rec)
        elif sub:
            items = kept.items[::-1]  # OpenAI's default order: newest first
            await _send(send, 200, {"object": "list", "data": items, "has_more": False,
                                    "first_id": items[0]["id"] if items else None,
                                    "last_id": items[-1]["id"] if items else None}, rec)
        else:
            await _send(send, 200, kept.response, rec)

    async def _create(self, headers: dict[str, str], data: dict[str, Any], rec: Recorded,
                      disconnected: asyncio.Event, send: Send,
                      touch: Callable[[], None], sims: CacheSims | None) -> None:
        previous = data.get("previous_response_id")
        before: list[dict[str, Any]] = []
        if previous is not None:
            if previous not in self.kept:
                await _send(send, 400, _error(f"Previous response with id '{previous}' not "
                                              "found.", "previous_response_id",
                                              "previous_response_not_found"), rec)
                return
            before = self.kept[previous].conversation
        items = _items(data)
        response = _response(data, headers, [*before, *items], sims)
        if data.get("store", True) is not False:
            conversation = [*before, *items, *response["output"]]
            self.kept[response["id"]] = _Kept(response, items, conversation)
        if not data.get("stream"):
            await _send(send, 200, response, rec)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache")]})
        rec.first_byte = time.monotonic()
        itl = float(headers.get("x-fake-itl-ms", 0)) / 1000
        die_after = int(headers.get("x-fake-die-after", -1))
        deltas, stalls, sent = 0, Stalls.of(headers), 0  # sent: deltas of any kind
        for number, (kind, event) in enumerate(_events(response, headers)):
            if kind.endswith(".delta"):
                if await stalls.before_delta(sent, send, disconnected, COMMENT_PING):
                    return
                sent += 1
            if kind == "response.output_text.delta":
                if deltas == die_after:
                    raise ConnectionAbortedError("fake upstream: dying mid-stream on request")
                if itl and deltas and await wait_or_left(disconnected, itl):
                    return
                deltas += 1
            if disconnected.is_set():
                return
            event = {"type": kind, "sequence_number": number, **event}
            await send({"type": "http.response.body", "more_body": True, "body": b"event: "
                        + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"})
            if kind == "response.output_text.delta":
                rec.chunks_sent += 1
                touch()
        await send({"type": "http.response.body", "body": b""})


def _response(data: dict[str, Any], headers: dict[str, str],
              conversation: list[dict[str, Any]], sims: CacheSims | None) -> dict[str, Any]:
    """The finished ``response`` object for a request continuing ``conversation``."""
    tools = data.get("tools") or []
    call = responses_call(data, headers, conversation)
    incomplete = headers.get("x-fake-finish") == "length"
    status = "incomplete" if incomplete else "completed"
    if call is not None:
        output, produced = [call], 1
    else:
        pieces = text_pieces(int(headers.get("x-fake-tokens", 8)), schema_of(data))
        output = [{"id": _id("msg"), "type": "message", "status": status, "role": "assistant",
                   "content": [{"type": "output_text", "text": "".join(pieces),
                                "annotations": [], "logprobs": []}]}]
        produced = len(pieces)
    sim = sims.openai(_as_chat(data, conversation), headers) if sims else None
    prompt, cached = (sim.prompt_tokens, sim.cached_tokens) if sim else (
        _words(data.get("instructions")) + _words(conversation), 0)
    usage = None if headers.get("x-fake-usage") == "0" else {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": produced, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + produced}
    return {
        "id": _id("resp"), "object": "response", "created_at": int(time.time()),
        "status": status, "background": False, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "metadata": data.get("metadata") or {}, "model": data.get("model", "fake-model"),
        "output": output, "parallel_tool_calls": data.get("parallel_tool_calls", True),
        "previous_response_id": data.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None}, "store": data.get("store", True),
        "temperature": data.get("temperature", 1.0),
        "text": data.get("text") or {"format": {"type": "text"}},
        "tool_choice": data.get("tool_choice", "auto"), "tools": tools,
        "top_p": data.get("top_p", 1.0), "truncation": "disabled", "usage": usage,
        "user": None}


def _events(response: dict[str, Any], headers: dict[str, str]
            ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The stream of ``response``: (event type, its fields but type and sequence number)."""
    start = {**response, "status": "in_progress", "output": [], "usage": None,
             "incomplete_details": None}
    yield "response.created", {"response": start}
    yield "response.in_progress", {"response": start}
    for index, item in enumerate(response["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] in ("function_call", "custom_tool_call"):
            field, kind = ("arguments", "function_call_arguments") if item["type"] == \
                "function_call" else ("input", "custom_tool_call_input")
            yield "response.output_item.added", {
                "output_index": index, "item": {**item, "status": "in_progress", field: ""}}
            args = item[field]
            for piece in (args[:3], args[3:]):
                yield f"response.{kind}.delta", {**at, "delta": piece}
            yield f"response.{kind}.done", {**at, field: args}
        else:
            [part] = item["content"]
            yield "response.output_item.added", {
                "output_index": index, "item": {**item, "status": "in_progress", "content": []}}
            at["content_index"] = 0
            yield "response.content_part.added", {**at, "part": {**part, "text": ""}}
            for piece in text_pieces(int(headers.get("x-fake-tokens", 8)), schema_of(response)):
                yield "response.output_text.delta", {**at, "delta": piece, "logprobs": []}
            yield "response.output_text.done", {**at, "text": part["text"], "logprobs": []}
            yield "response.content_part.done", {**at, "part": part}
        yield "response.output_item.done", {"output_index": index, "item": item}
    yield f"response.{response['status']}", {"response": response}


def schema_of(body: Any) -> Any:
    """The JSON Schema a request (or a response) asks the text to follow: chat's
    ``response_format``, Responses' ``text.format``, of type ``json_schema``; else None."""
    if not isinstance(body, dict):
        return None
    text = body.get("text")
    fmt = body.get("response_format") or (text.get("format") if isinstance(text, dict) else None)
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        inner = fmt.get("json_schema") or fmt
        return inner.get("schema", {}) if isinstance(inner, dict) else None
    return None


async def _send(send: Send, status: int, obj: Any, rec: Recorded) -> None:
    body = orjson.dumps(obj)
    start: Message = {"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    await send(start)
    rec.first_byte = time.monotonic()
    await send({"type": "http.response.body", "body": body})
