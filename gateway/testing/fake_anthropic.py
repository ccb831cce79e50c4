"""A fake Anthropic Messages API upstream for tests and benchmarks (raw ASGI, no framework).

It speaks the real wire format (https://docs.anthropic.com/en/api/messages, /streaming,
/errors): ``POST /v1/messages`` answers a ``message`` or, streaming, its SSE events with their
``event:`` lines; ``POST /v1/messages/count_tokens``, ``{"input_tokens": N}``; other paths,
404; errors, ``{"type": "error", "error": {"type", "message"}, "request_id"}``. Requests are
checked as strictly as the real API does (:func:`check_headers`, :func:`validate_request`): a
translator bug fails loudly, a 400 naming the field. Steering headers (as in the OpenAI fake):

=========================  ===========================================================
``x-fake-ttft-ms``          delay before the first byte of the response (default 0)
``x-fake-itl-ms``           delay between streamed deltas (default 0)
``x-fake-tokens``           words ``tok0 ...`` (default 8; max_tokens cuts), or JSON (json_schema)
``x-fake-status``           answer this status, an Anthropic error (529 overloaded_error...)
``x-fake-retry-after``      retry-after header (seconds) sent with that status
``x-fake-fail-times``       fail (x-fake-status, else 529) the first N with this x-fake-key
``x-fake-die-after``        streaming: drop the connection after N text deltas
``x-fake-error-midway``     streaming: after N text deltas, ``event: error`` and the end
``x-fake-stop-reason``      stop_reason of the answer (default end_turn)
``x-fake-cache-read``       usage.cache_read_input_tokens (input_tokens excludes them)
``x-fake-cache-write``      usage.cache_creation_input_tokens (likewise)
``x-fake-tool``             then call the first custom tool with ``{"x": 1}`` (``agent``: tool_args)
``x-fake-thinking``         first a thinking block of N words, with a signature
=========================  ===========================================================
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from gateway.testing.fake_responses import json_instance
from gateway.testing.fake_upstream import FakeUpstream, Record, _send_json, _wait
from gateway.testing.tool_args import anthropic_tool_use
from gateway.types import Message, Send

__all__ = ["ApiError", "FakeAnthropic", "Record", "check_headers", "count_tokens",
           "validate_request"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}
_ROUTES = {"/v1/messages": "create", "/v1/messages/count_tokens": "count"}
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")

# Shapes, from the SDK's request types: key -> type, tuple of types or frozenset of strings;
# "key?": optional (null too); "*": any other key, else "Extra inputs are not permitted".
Spec = dict[str, Any]
_CC = "cache_control?"
_COUNT: Spec = {"model": str, "messages": list, _CC: dict, "output_config?": dict, "speed?": str,
                "system?": (str, list), "thinking?": dict, "tool_choice?": dict, "tools?": list,
                "user_profile_id?": str, "workspace_id?": str, "context_management?": dict}
_CREATE: Spec = {**_COUNT, "max_tokens": int, "container?": object, "diagnostics?": dict,
                 "inference_geo?": str, "metadata?": dict, "stop_sequences?": list,
                 "service_tier?": frozenset({"auto", "standard_only"}), "stream?": bool,
                 "temperature?": float, "top_k?": int, "top_p?": float}
_RANGES = {"max_tokens": (0, None), "temperature": (0, 1), "top_p": (0, 1), "top_k": (0, None)}
_CUSTOM_TOOL: Spec = {"name": str, "input_schema": dict, "type?": str, "description?": str,
                      _CC: dict, "strict?": bool, "allowed_callers?": list, "defer_loading?": bool,
                      "eager_input_streaming?": bool, "input_examples?": list}
_SERVER_BLOCKS = ("server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
                  "code_execution_tool_result", "bash_code_execution_tool_result",
                  "tool_search_tool_result", "text_editor_code_execution_tool_result")
_TOOLSET = {"toolset_name?": str, _CC: dict}
_BLOCKS: dict[str, Spec] = {
    "text": {"text": str, _CC: dict, "citations?": list},
    "image": {"source": dict, _CC: dict, "transformations?": dict},
    "document": {"source": dict, _CC: dict, "citations?": dict, "context?": str, "title?": str},
    "search_result": {"content": list, "source": str, "title": str, _CC: dict, "citations?": dict},
    "thinking": {"thinking": str, "signature": str}, "redacted_thinking": {"data": str},
    "tool_use": {"id": str, "name": str, "input": dict, "caller?": dict, **_TOOLSET},
    "tool_result": {"tool_use_id": str, "content?": (str, list), "is_error?": bool, **_TOOLSET},
    "tool_reference": {"tool_name": str, _CC: dict},  # and, loosely checked:
    **{kind: {"*": object} for kind in ("browser_state", "container_upload", *_SERVER_BLOCKS)},
}
_ASSISTANT_ONLY = {"tool_use", "thinking", "redacted_thinking", *_SERVER_BLOCKS}
_BY_ROLE = {"system": {"text"}, "user": set(_BLOCKS) - _ASSISTANT_ONLY,
            "assistant": set(_BLOCKS) - {"tool_result"}}
_INSIDE = {"tool_result": {"text", "image", "search_result", "document", "tool_reference",
                           "browser_state"}, "search_result": {"text"}}
_REF = {"url": {"url": str}, "file": {"file_id": str}}
_IMAGES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_SOURCES: dict[str, dict[str, Spec]] = {
    "image": {"base64": {"data": str, "media_type": _IMAGES}, **_REF},
    "document": {"base64": {"data": str, "media_type": frozenset({"application/pdf"})}, **_REF,
                 "text": {"data": str, "media_type": frozenset({"text/plain"})},
                 "content": {"content": (str, list)}},
}
_PARALLEL = {"disable_parallel_tool_use?": bool}
_CHOICES: dict[str, Spec] = {"auto": _PARALLEL, "any": _PARALLEL, "none": {},
                             "tool": {"name": str, **_PARALLEL}}
_THINKING: dict[str, Spec] = {"enabled": {"budget_tokens": int, "display?": str},
                              "adaptive": {"display?": str}, "disabled": {}}
_CACHE: Spec = {"type": frozenset({"ephemeral"}), "ttl?": frozenset({"5m", "1h"})}
_COUNTED = ("system", "messages", "tools", "content", "text", "thinking", "description")
_TYPE_NAMES = {str: "a valid string", dict: "a valid dictionary", list: "a valid list",
               bool: "a valid boolean", int: "a valid integer", float: "a valid number"}


class ApiError(Exception):
    """An Anthropic error answer: HTTP ``status``, ``error.type`` and ``error.message``."""

    def __init__(self, status: int, message: str, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.type = _ERROR_TYPES.get(status, "api_error")

    def body(self, request_id: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message},
                "request_id": request_id}


_bad = partial(ApiError, 400)  # an invalid_request_error


def check_headers(headers: dict[str, str], api_key: str | None = None) -> None:
    """Raises :class:`ApiError` 401 without a key (``x-api-key`` or ``authorization: Bearer``)
    or, when ``api_key`` is set, with another one; 400 without ``anthropic-version``."""
    key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    if not key:
        raise ApiError(401, "x-api-key header is required")
    if api_key is not None and key != api_key:
        raise ApiError(401, "invalid x-api-key")
    if not headers.get("anthropic-version"):
        raise _bad("anthropic-version: header is required")


def validate_request(data: Any, *, count_tokens: bool = False) -> None:
    """Checks a Messages (``count_tokens``: count_tokens) body as the real API does; raises
    :class:`ApiError` 400 naming the field, pydantic-style: fields, types, ranges, blocks by type
    and role, ``tool_use``/``tool_result`` pairing across turns (same-role messages merge, as
    documented), tools, at most 4 cache breakpoints. ``max_tokens`` may be 0 (SDK 2.12 docs)."""
    marks: list[str] = []  # where the cache_control breakpoints are
    _shape(data, "", _COUNT if count_tokens else _CREATE, marks)  # top-level: automatic caching
    for name, (low, high) in _RANGES.items():
        if (value := data.get(name)) is not None and not low <= value <= (high or value):
            raise _bad(f"{name}: Input should be >= {low}" + (f" and <= {high}" if high else ""))
    for i, seq in enumerate(data.get("stop_sequences") or ()):
        _shape({"s": seq}, f"stop_sequences.{i}", {"s": str})
    if data.get("thinking") is not None:
        _tagged(data["thinking"], "thinking", _THINKING)
    for j, block in enumerate(data["system"] if isinstance(data.get("system"), list) else ()):
        _block(block, f"system.{j}", _BY_ROLE["system"], marks)
    names = _tools(data.get("tools") or [], marks)
    if data.get("tool_choice") is not None:
        choice = _tagged(data["tool_choice"], "tool_choice", _CHOICES)
        called = choice.get("name", names[0] if names else None)
        if choice["type"] in ("any", "tool") and called not in names:
            raise _bad(f"tool_choice: {choice['type']!r} needs the tool in `tools`")
    _messages(data["messages"], marks)
    if len(marks) > 4:
        raise _bad(f"A maximum of 4 blocks with cache_control may be provided. "
                   f"Found {len(marks)}.")


def _shape(obj: Any, path: str, spec: Spec, marks: list[str] | None = None) -> dict[str, Any]:
    """Checks ``obj`` against ``spec``; returns it. ``marks``: where cache breakpoints are."""
    if not isinstance(obj, dict):
        raise _bad(f"{path or 'body'}: Input should be a valid dictionary")
    for key in [*(k for k in spec if k[-1] not in "?*" and k not in obj), *obj]:
        at = f"{path}.{key}".lstrip(".")
        if key not in obj:
            raise _bad(f"{at}: Field required")
        want, value = spec.get(key, spec.get(key + "?", spec.get("*"))), obj[key]
        if want is None:
            raise _bad(f"{at}: Extra inputs are not permitted")
        wants = want if isinstance(want, tuple) else (want,)
        if (value is None and key not in spec) or object in wants:
            continue  # null is fine for an optional field
        if isinstance(want, frozenset) and not (isinstance(value, str) and value in want):
            raise _bad(f"{at}: Input should be {' or '.join(map(repr, sorted(want)))}")
        if not isinstance(want, frozenset) and not any(
                isinstance(value, (int, float) if w is float else w)
                and (w is bool or not isinstance(value, bool)) for w in wants):
            raise _bad(f"{at}: Input should be {' or '.join(_TYPE_NAMES[w] for w in wants)}")
    if marks is not None and obj.get("cache_control") is not None:
        _shape(obj["cache_control"], f"{path}.cache_control".lstrip("."), _CACHE)
        marks.append(path)
    return obj


def _tagged(obj: Any, path: str, table: dict[str, Spec],
            marks: list[str] | None = None) -> dict[str, Any]:
    kind = obj.get("type") if isinstance(obj, dict) else None
    if not isinstance(kind, str) or kind not in table:
        raise _bad(f"{path}: Input tag {kind!r} found using 'type' does not match any of the "
                   f"expected tags: {', '.join(map(repr, table))}")
    return _shape(obj, path, {"type": str, **table[kind]}, marks)


def _tools(tools: list[Any], marks: list[str]) -> list[str]:
    names: list[str] = []
    for i, tool in enumerate(tools):
        path = f"tools.{i}"
        if isinstance(tool, dict) and tool.get("type") not in (None, "custom"):  # server tools
            _shape(tool, path, {"type": str, "name": str, "*": object}, marks)
        elif _shape(tool, path, _CUSTOM_TOOL, marks)["input_schema"].get("type") != "object":
            raise _bad(f"{path}.input_schema.type: Input should be 'object'")
        if not _TOOL_NAME.fullmatch(tool["name"]):
            raise _bad(f"{path}.name: String should match pattern '{_TOOL_NAME.pattern}'")
        if tool["name"] in names:
            raise _bad("tools: Tool names must be unique.")
        names.append(tool["name"])
    return names


def _messages(messages: list[Any], marks: list[str]) -> None:
    if not messages:
        raise _bad("messages: at least one message is required")
    turns: list[tuple[str, int, list[dict[str, Any]]]] = []  # (role, first index, blocks)
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        spec = {"role": frozenset(_BY_ROLE), "content": (str, list)}
        role, content = _shape(message, path, spec)["role"], message["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for j, block in enumerate(content if isinstance(content, list) else ()):
            _block(block, f"{path}.content.{j}", _BY_ROLE[role], marks)
        if not content and not (i == len(messages) - 1 and role == "assistant"):
            raise _bad(f"{path}: all messages must have non-empty content except for the "
                       "optional final assistant message")
        kinds = [block["type"] for block in blocks]
        if "tool_result" in kinds[kinds.count("tool_result"):]:
            raise _bad(f"{path}.content: tool_result blocks must come first in a user message")
        if turns and turns[-1][0] == role:
            turns[-1][2].extend(blocks)
        else:
            turns.append((role, i, list(blocks)))
    pending: list[str] = []  # tool_use ids of the previous turn, awaiting their results
    at = 0
    for _, i, blocks in [*turns, ("end", len(messages), [])]:
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if orphans := [r for r in results if r not in pending]:
            raise _bad(f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: "
                       f"{', '.join(orphans)}. Each `tool_result` block must have a "
                       "corresponding `tool_use` block in the previous message.")
        if missing := [p for p in pending if p not in results]:
            raise _bad(f"messages.{at}: `tool_use` ids were found without `tool_result` blocks "
                       f"immediately after: {', '.join(missing)}. Each `tool_use` block must "
                       "have a corresponding `tool_result` block in the next message.")
        pending, at = [b["id"] for b in blocks if b["type"] == "tool_use"], i


def _block(block: Any, path: str, allowed: set[str], marks: list[str]) -> None:
    kind = _tagged(block, path, _BLOCKS, marks)["type"]
    if kind not in allowed:
        raise _bad(f"{path}: `{kind}` blocks are not allowed here")
    if kind == "text" and not block["text"].strip():
        raise _bad(f"{path}.text: text content blocks must contain non-whitespace text")
    if kind in _SOURCES:
        _tagged(block["source"], f"{path}.source", _SOURCES[kind])
    inner = block.get("content") if kind in _INSIDE else None
    for j, item in enumerate(inner if isinstance(inner, list) else ()):
        _block(item, f"{path}.content.{j}", _INSIDE[kind], marks)


def count_tokens(data: Any) -> int:
    """The fake's deterministic prompt size for a request body: whitespace-separated words of the
    system prompt, the messages' text (text, thinking, tool_result content), tool descriptions."""
    if isinstance(data, str):
        return len(data.split())
    if isinstance(data, dict):
        data = [data.get(key) for key in _COUNTED]
    return sum(map(count_tokens, data)) if isinstance(data, list) else 0


def _answer(data: dict[str, Any], headers: dict[str, str], cache: Any = None) -> dict[str, Any]:
    """The whole ``message`` the headers ask for; ``cache``: simulated usage fields or None."""
    wanted = int(headers.get("x-fake-tokens", 8))
    n = min(wanted, data["max_tokens"])
    content: list[dict[str, Any]] = []
    if thinking := int(headers.get("x-fake-thinking", 0)):
        content.append({"type": "thinking", "signature": f"sig_fake_{thinking}",
                        "thinking": " ".join(f"think{i}" for i in range(thinking))})
    fmt = (data.get("output_config") or {}).get("format")  # structured outputs
    text = orjson.dumps(json_instance(fmt.get("schema"))).decode() if isinstance(fmt, dict) \
        and fmt.get("type") == "json_schema" else " ".join(f"tok{i}" for i in range(n))
    content += [{"type": "text", "text": text}] if n else []
    tool = anthropic_tool_use(data, headers) if n == wanted else None
    content += [tool] if tool else []
    stop = headers.get("x-fake-stop-reason") or (
        "max_tokens" if n < wanted else "tool_use" if tool else "end_turn")
    read, write = (int(headers.get(f"x-fake-cache-{k}", 0)) for k in ("read", "write"))
    usage = {"input_tokens": max(count_tokens(data) - read - write, 0),
             "cache_creation_input_tokens": write, "cache_read_input_tokens": read, **(cache or {}),
             "output_tokens": n + thinking + (1 if tool else 0)}  # words, and 1 per tool call
    return {"id": f"msg_fake{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant",
            "model": data["model"], "content": content, "stop_reason": stop,
            "stop_sequence": (data.get("stop_sequences") or [None])[0]
            if stop == "stop_sequence" else None, "usage": usage}


def _events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The stream of a whole ``message``: (event, body without "type"), in the API's order."""
    usage = {**message["usage"], "output_tokens": 1}  # what the API knows before generating
    yield "message_start", {"message": {**message, "content": [], "stop_reason": None,
                                        "stop_sequence": None, "usage": usage}}
    yield "ping", {}
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "tool_use":
            first, text = {**block, "input": {}}, orjson.dumps(block["input"]).decode()
            deltas = [{"type": "input_json_delta", "partial_json": text[i:i + 4]}
                      for i in range(0, len(text), 4)]  # pieces, as the API sends them
        else:  # text or thinking, a word a delta
            first = {"type": kind, kind: "", **({"signature": ""} if kind == "thinking" else {})}
            deltas = [{"type": f"{kind}_delta", kind: w if i == 0 else " " + w}
                      for i, w in enumerate(block[kind].split(" "))]
            if kind == "thinking":
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        yield "content_block_start", {"index": index, "content_block": first}
        for delta in deltas:
            yield "content_block_delta", {"index": index, "delta": delta}
        yield "content_block_stop", {"index": index}
    yield "message_delta", {"delta": {k: message[k] for k in ("stop_reason", "stop_sequence")},
                            "usage": {"output_tokens": message["usage"]["output_tokens"]}}
    yield "message_stop", {}


def _sse(event: str, obj: dict[str, Any], more: bool = True) -> Message:
    body = b"event: " + event.encode() + b"\ndata: " + orjson.dumps({"type": event, **obj})
    return {"type": "http.response.body", "body": body + b"\n\n", "more_body": more}


@dataclass
class FakeAnthropic(FakeUpstream):
    """The ASGI app. ``api_key``: the only key accepted (401 otherwise); None: any key. Its
    plumbing (recording, disconnect watching, ``capacity``, ``simulate_cache``) is that of
    :class:`FakeUpstream`: both share :class:`Record`, ``records``, ``wait_for``, ``clear``."""

    api_key: str | None = None

    async def _dispatch(self, path: str, headers: dict[str, str], data: Any, raw: bytes,
                        rec: Record, disconnected: asyncio.Event, send: Send) -> None:
        request_id = f"req_fake{uuid.uuid4().hex[:20]}"
        ids = [(b"request-id", request_id.encode())]
        try:
            route = _ROUTES.get(path) if rec.method == "POST" else None
            if route is None:
                raise ApiError(404, f"Not found: {rec.method} {path}")
            check_headers(headers, self.api_key)
            validate_request(data, count_tokens=route == "count")
            if (ttft := float(headers.get("x-fake-ttft-ms", 0))) and await _wait(
                    disconnected, ttft / 1000):
                return
            status = int(headers.get("x-fake-status", 0))
            if fail_times := int(headers.get("x-fake-fail-times", 0)):
                self._fail_counts[key := headers.get("x-fake-key", "")] += 1
                status = 0 if self._fail_counts[key] > fail_times else status or 529
            if status:
                raise ApiError(status, "Overloaded" if status == 529 else
                               f"fake upstream error {status}", headers.get("x-fake-retry-after"))
            if route == "count":
                return await _send_json(send, 200, {"input_tokens": count_tokens(data)}, rec, ids)
            cache = self.simulate_cache and self._sims.anthropic(data, headers)
            message = _answer(data, headers, cache)
        except ApiError as exc:
            extra = [(b"retry-after", exc.retry_after.encode())] if exc.retry_after else []
            await _send_json(send, exc.status, exc.body(request_id), rec, ids + extra)
            return
        if data.get("stream"):
            await self._send_stream(message, headers, rec, disconnected, send, ids)
        else:
            await _send_json(send, 200, message, rec, ids)

    async def _send_stream(self, message: dict[str, Any], headers: dict[str, str], rec: Record,
                           disconnected: asyncio.Event, send: Send,
                           ids: list[tuple[bytes, bytes]]) -> None:
        itl = float(headers.get("x-fake-itl-ms", 0)) / 1000
        die_after = int(headers.get("x-fake-die-after", -1))
        midway = int(headers.get("x-fake-error-midway", -1))
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            *ids]})
        rec.first_byte = time.monotonic()
        delay = False
        for event, obj in _events(message):
            text = event == "content_block_delta" and obj["delta"]["type"] == "text_delta"
            if text and rec.chunks_sent == die_after:
                raise ConnectionAbortedError("fake anthropic: dying mid-stream on request")
            if text and rec.chunks_sent == midway:
                return await send(_sse("error", {"error": {
                    "type": "overloaded_error", "message": "Overloaded"}}, more=False))
            if event == "content_block_delta":
                if (itl and delay and await _wait(disconnected, itl)) or disconnected.is_set():
                    return
                delay = True
            await send(_sse(event, obj, more=event != "message_stop"))
            if text:
                rec.chunks_sent += 1
                if self.record_requests:
                    self._touch()  # a test may be waiting for the count (wait_for)
