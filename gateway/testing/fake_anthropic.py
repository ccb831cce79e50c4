"""A fake Anthropic Messages API upstream for tests and benchmarks (raw ASGI, no framework).

It speaks the real wire format (https://docs.anthropic.com/en/api/messages, /streaming,
/errors): ``POST /v1/messages`` answers a ``message`` or, streaming, its SSE events with their
``event:`` lines; ``POST /v1/messages/count_tokens``, ``{"input_tokens": N}``; other paths,
404; errors, ``{"type": "error", "error": {"type", "message"}, "request_id"}``. Requests are
checked as strictly as the real API does (:mod:`gateway.testing.anthropic_rules`:
:func:`check_headers`, :func:`validate_request`): a translator bug fails loudly, a 400 naming
the field. Steering headers (as in the OpenAI fake):

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
``x-fake-space-after``      streaming: each text delta a word and the space after it
``x-fake-no-system-role``   the model takes no system-role message in ``messages`` (as
                            Claude models before Opus 4.8): a 400 when one is there
=========================  ===========================================================

A final assistant message (a prefill) that the answer's text begins with is answered with
the rest of it only, as the API continues a prefill; one ending in whitespace is a 400, as
the API refuses it.

Late first deltas and stalls, pings meanwhile: :mod:`gateway.testing.fake_stalls`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.testing.anthropic_rules import (
    ApiError,
    check_headers,
    refuse_system_role,
    validate_request,
)
from gateway.testing.fake_responses import json_instance
from gateway.testing.fake_stalls import ANTHROPIC_PING, Stalls
from gateway.testing.fake_upstream import FakeUpstream, Record, _send_json, _wait
from gateway.testing.tool_args import anthropic_tool_use
from gateway.types import Message, Send

__all__ = ["ApiError", "FakeAnthropic", "Record", "check_headers", "count_tokens",
           "validate_request"]

_ROUTES = {"/v1/messages": "create", "/v1/messages/count_tokens": "count"}
_COUNTED = ("system", "messages", "tools", "content", "text", "thinking", "description")


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
    prefill = _prefill(data)  # the API continues it (a 400 before, when refused)
    full = " ".join(f"tok{i}" for i in range(wanted))
    done = len(prefill.split()) if prefill and full.startswith(prefill) else 0
    n = min(wanted, data["max_tokens"] + done)
    content: list[dict[str, Any]] = []
    if thinking := int(headers.get("x-fake-thinking", 0)):
        content.append({"type": "thinking", "signature": f"sig_fake_{thinking}",
                        "thinking": " ".join(f"think{i}" for i in range(thinking))})
    fmt = (data.get("output_config") or {}).get("format")  # structured outputs
    text = orjson.dumps(json_instance(fmt.get("schema"))).decode() if isinstance(fmt, dict) \
        and fmt.get("type") == "json_schema" else " ".join(f"tok{i}" for i in range(n))
    text = text[len(prefill):] if done else text
    content += [{"type": "text", "text": text}] if n > done else []
    tool = anthropic_tool_use(data, headers) if n == wanted else None
    content += [tool] if tool else []
    stop = headers.get("x-fake-stop-reason") or (
        "max_tokens" if n < wanted else "tool_use" if tool else "end_turn")
    read, write = (int(headers.get(f"x-fake-cache-{k}", 0)) for k in ("read", "write"))
    usage = {"input_tokens": max(count_tokens(data) - read - write, 0),
             "cache_creation_input_tokens": write, "cache_read_input_tokens": read, **(cache or {}),
             "output_tokens": n - done + thinking + (1 if tool else 0)}  # words, and 1 per tool call
    return {"id": f"msg_fake{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant",
            "model": data["model"], "content": content, "stop_reason": stop,
            "stop_sequence": (data.get("stop_sequences") or [None])[0]
            if stop == "stop_sequence" else None, "usage": usage}


def _prefill(data: dict[str, Any]) -> str:
    """The text of a final assistant message (a prefill), else ""; a 400 when it ends in
    whitespace, as the API answers."""
    last = data["messages"][-1]
    if last.get("role") != "assistant":
        return ""
    content = last.get("content")
    text = content if isinstance(content, str) else "".join(
        b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    if text != text.rstrip():
        raise ApiError(400, "messages: final assistant content cannot end with trailing "
                            "whitespace")
    return text


def _events(message: dict[str, Any], space_after: bool = False
            ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The stream of a whole ``message``: (event, body without "type"), in the API's order;
    ``space_after``: each text delta a word and the space after it (not before)."""
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
            words = block[kind].split(" ")
            deltas = [{"type": f"{kind}_delta", kind: w if i == 0 else " " + w}
                      for i, w in enumerate(words) if w or i]
            if space_after and kind == "text":
                deltas = [{"type": "text_delta", "text": w + " " * (i < len(words) - 1)}
                          for i, w in enumerate(words)]
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
            if "x-fake-no-system-role" in headers:
                refuse_system_role(data)
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
        delay, stalls, deltas = False, Stalls.of(headers), 0
        for event, obj in _events(message, "x-fake-space-after" in headers):
            text = event == "content_block_delta" and obj["delta"]["type"] == "text_delta"
            if text and rec.chunks_sent == die_after:
                raise ConnectionAbortedError("fake anthropic: dying mid-stream on request")
            if text and rec.chunks_sent == midway:
                return await send(_sse("error", {"error": {
                    "type": "overloaded_error", "message": "Overloaded"}}, more=False))
            if event == "content_block_delta":
                if (itl and delay and await _wait(disconnected, itl)) or disconnected.is_set():
                    return
                if await stalls.before_delta(deltas, send, disconnected, ANTHROPIC_PING):
                    return
                delay, deltas = True, deltas + 1
            await send(_sse(event, obj, more=event != "message_stop"))
            if text:
                rec.chunks_sent += 1
                if self.record_requests:
                    self._touch()  # a test may be waiting for the count (wait_for)
