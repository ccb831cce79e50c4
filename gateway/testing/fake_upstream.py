"""A fake OpenAI-compatible upstream for tests and benchmarks (raw ASGI, no framework).

It speaks the real wire format (chat.completion / chat.completion.chunk, SSE with
``data: [DONE]``, OpenAI error JSON; the Responses API natively, with its state, in
:mod:`gateway.testing.fake_responses`) and is steered per request by headers:

=========================  =========================================================
``x-fake-ttft-ms``          delay before the first byte of the response (default 0)
``x-fake-itl-ms``           delay between streamed chunks (default 0)
``x-fake-tokens``           content chunks in the reply (default 8)
``x-fake-status``           answer this HTTP status with an OpenAI error body (all paths)
``x-fake-error-code``       the ``error.code`` of that body (default null)
``x-fake-retry-after``      Retry-After header (seconds) sent with that status
``x-fake-retry-after-ms``   retry-after-ms header (OpenAI's millisecond variant)
``x-fake-fail-times``       fail only the first N requests carrying the same
                            ``x-fake-key`` (then answer normally)
``x-fake-die-after``        streaming: drop the connection after N content chunks
``x-fake-error-midway``     streaming: after N content chunks, ``data: {"error": ...}``, the end
``x-fake-usage``            "0": never send usage (some OpenAI-compatible servers don't)
``x-fake-set-cookie``       send this Set-Cookie header with a completion
``x-fake-finish``           finish_reason (default "stop"; Responses: "length" is incomplete)
``x-fake-tail-ms``          streaming: end the body this long after ``[DONE]``
``x-fake-tool``             call the request's first function tool with ``{"x": 1}`` (or
                            the JSON of ``x-fake-tool-args``) instead of answering text (chat:
                            finish_reason "tool_calls"); ``once``: only while no tool result is
                            in the conversation (chat: a ``tool`` message; Responses: a
                            ``function_call_output`` item), so an agent's loop ends; ``agent``:
                            a real client's own tool, with arguments valid for its schema,
                            once (:mod:`gateway.testing.tool_args`: ``x-fake-tool-prefer``,
                            ``x-fake-tool-dir``)
``x-fake-cache-scope``      with ``simulate_cache``: which simulated cache (default "")
``x-fake-clock``            with ``simulate_cache``: the simulated time (s) of the request
``x-fake-hold``             answer only once the test calls ``release(NAME)`` with this value
                            (or the client has left): an upstream as slow as a test needs
=========================  =========================================================

Continuing a final assistant message (``continue_final_message``): :mod:`.fake_continue`. Late
first tokens and stalls (``x-fake-first-token-ms``...): :mod:`.fake_stalls`, in every fake.

Structured outputs: with a ``json_schema`` ``response_format`` (Responses: ``text.format``)
the text is a JSON instance of the schema (:func:`.fake_responses.json_instance`).

``FakeUpstream(simulate_cache=True)``: chat's and Responses' prompt and cached tokens from a
simulation of OpenAI's prompt caching (:mod:`gateway.testing.cache_sim`), not a word count.

Every request is recorded (:class:`Record`): headers, JSON body, monotonic times of arrival,
first byte, completion and client disconnect (tests await them with :meth:`~.wait_for`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.testing.cache_sim import CacheSims, PromptUsage
from gateway.testing.fake_continue import continued
from gateway.testing.fake_responses import FakeResponses, schema_of, text_pieces, wait_or_left
from gateway.testing.fake_stalls import COMMENT_PING, Stalls
from gateway.testing.tool_args import chat_tool_call as _tool_call
from gateway.types import Receive, Scope, Send

__all__ = ["FakeUpstream", "Record"]
_wait = wait_or_left  # the name fake_anthropic imports


@dataclass
class Record:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    json: Any
    arrived: float
    first_byte: float | None = None
    finished: float | None = None
    disconnected: float | None = None
    chunks_sent: int = 0

    @property
    def request_id(self) -> str | None:
        return self.headers.get("x-request-id")


@dataclass
class FakeUpstream:
    """The ASGI app. ``record_requests=False`` keeps benchmarks allocation-light."""

    record_requests: bool = True
    #: Requests served at once; more wait for a slot (like a saturated model server).
    #: 0: unlimited.
    capacity: int = 0
    #: Usage from simulated provider prompt caches (module docstring); off: fixed counts.
    simulate_cache: bool = False
    records: list[Record] = field(default_factory=list)
    _sims: CacheSims = field(default_factory=CacheSims)
    _slots: asyncio.Semaphore | None = None
    _fail_counts: Counter[str] = field(default_factory=Counter)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _released: set[str] = field(default_factory=set)
    _holds: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = field(
        default_factory=dict)
    _responses: FakeResponses = field(default_factory=FakeResponses)

    # -- test helpers ---------------------------------------------------------------------
    def wait_for(self, predicate: Callable[[list[Record]], Any], timeout: float = 5.0) -> Any:
        """Block until ``predicate(records)`` is truthy (returns it), or raise TimeoutError."""
        with self._cond:
            result = self._cond.wait_for(lambda: predicate(self.records), timeout)
        if not result:
            raise TimeoutError("fake upstream: condition not met in time")
        return result

    def _touch(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self.records.clear()
            self._fail_counts.clear()
            self._released.clear()
            self._responses.clear()

    def release(self, name: str) -> None:
        """Let the requests held with ``x-fake-hold: NAME`` answer, now and from now on."""
        with self._cond:
            self._released.add(name)
            held = self._holds.pop(name, [])
        for loop, event in held:
            loop.call_soon_threadsafe(event.set)

    async def _held(self, name: str, disconnected: asyncio.Event) -> bool:
        """Wait for ``release(name)``; True when the client left first."""
        with self._cond:
            if name in self._released:
                return False
            released = asyncio.Event()
            self._holds.setdefault(name, []).append((asyncio.get_running_loop(), released))
        waits = [asyncio.ensure_future(released.wait()),
                 asyncio.ensure_future(disconnected.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        return disconnected.is_set()

    # -- ASGI -----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            data = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            data = None
        rec = Record(scope["path"], scope["method"], headers, body, data, time.monotonic())
        if self.record_requests:
            with self._cond:
                self.records.append(rec)
                self._cond.notify_all()
        disconnected = asyncio.Event()
        watcher = asyncio.create_task(self._watch(receive, rec, disconnected))
        try:
            if self.capacity:
                if self._slots is None:
                    self._slots = asyncio.Semaphore(self.capacity)
                async with self._slots:
                    if not disconnected.is_set():
                        await self._dispatch(scope["path"], headers, data, body, rec,
                                             disconnected, send)
            else:
                await self._dispatch(scope["path"], headers, data, body, rec, disconnected, send)
        finally:
            if not watcher.done():
                watcher.cancel()
            rec.finished = rec.finished or time.monotonic()
            self._touch()

    async def _watch(self, receive: Receive, rec: Record, event: asyncio.Event) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                rec.disconnected = time.monotonic()
                event.set()
                self._touch()
                return

    async def _dispatch(
        self,
        path: str,
        headers: dict[str, str],
        data: Any,
        raw: bytes,
        rec: Record,
        disconnected: asyncio.Event,
        send: Send,
    ) -> None:
        ttft = float(headers.get("x-fake-ttft-ms", 0)) / 1000
        if ttft and await _wait(disconnected, ttft):
            return
        hold = headers.get("x-fake-hold")
        if hold and await self._held(hold, disconnected):
            return
        status = int(headers.get("x-fake-status", 0))
        fail_times = int(headers.get("x-fake-fail-times", 0))
        if fail_times:
            key = headers.get("x-fake-key", "")
            self._fail_counts[key] += 1
            if self._fail_counts[key] > fail_times:
                status = 0
            elif not status:
                status = 503
        if status:
            extra = []
            if "x-fake-retry-after" in headers:
                extra.append((b"retry-after", headers["x-fake-retry-after"].encode()))
            if "x-fake-retry-after-ms" in headers:
                extra.append((b"retry-after-ms", headers["x-fake-retry-after-ms"].encode()))
            err = {"message": f"fake upstream error {status}", "type": "server_error",
                   "param": None, "code": headers.get("x-fake-error-code")}
            await _send_json(send, status, {"error": err}, rec, extra)
            return
        sims = self._sims if self.simulate_cache and isinstance(data, dict) else None
        if path.endswith(("/chat/completions", "/completions")):
            chat = path.endswith("/chat/completions")
            sim = sims.openai(data, headers) if sims and chat else None
            if isinstance(data, dict) and data.get("stream"):
                await self._stream(data, headers, chat, rec, disconnected, send, sim)
            else:
                cookie = headers.get("x-fake-set-cookie")
                cookies = [(b"set-cookie", cookie.encode())] if cookie else None
                await _send_json(send, 200, _completion(data, headers, chat, sim), rec, cookies)
        elif path.endswith("/embeddings"):
            await _send_json(send, 200, _embeddings(data), rec)
        elif "/responses" in path:
            await self._responses(path, headers, data, rec, disconnected, send, self._touch, sims)
        elif path.endswith("/models"):
            await _send_json(send, 200, {"object": "list", "data": [
                {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]}, rec)
        else:  # echo, for byte-for-byte passthrough tests
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/octet-stream"),
                (b"x-fake-path", path.encode()), (b"x-fake-method", rec.method.encode())]})
            rec.first_byte = time.monotonic()
            await send({"type": "http.response.body", "body": raw})

    async def _stream(
        self,
        data: dict[str, Any],
        headers: dict[str, str],
        chat: bool,
        rec: Record,
        disconnected: asyncio.Event,
        send: Send,
        sim: PromptUsage | None = None,
    ) -> None:
        itl = float(headers.get("x-fake-itl-ms", 0)) / 1000
        n = int(headers.get("x-fake-tokens", 8))
        die_after = int(headers.get("x-fake-die-after", -1))
        midway = int(headers.get("x-fake-error-midway", -1))
        model = data.get("model", "fake-model")
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk" if chat else
                "text_completion", "created": 1_700_000_000, "model": model}
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        rec.first_byte = time.monotonic()
        want_usage = bool((data.get("stream_options") or {}).get("include_usage"))
        usage_extra = {"usage": None} if want_usage else {}
        if chat:
            first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}], **usage_extra}
            await send(_event(first))
        call = _tool_call(data, headers) if chat else None
        pieces = [] if call else continued(text_pieces(n, schema_of(data)), data)
        stalls = Stalls.of(headers)
        if call is not None:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            deltas = [{"index": 0, "id": call["id"], "type": "function",
                       "function": {"name": name, "arguments": arguments[:3]}},
                      {"index": 0, "function": {"arguments": arguments[3:]}}]
            for k, delta in enumerate(deltas):
                if await stalls.before_delta(k, send, disconnected, COMMENT_PING):
                    return
                await send(_event({**base, "choices": [{"index": 0, "delta": {
                    "tool_calls": [delta]}, "finish_reason": None}], **usage_extra}))
        for i, piece in enumerate(pieces):
            if i == die_after:
                raise ConnectionAbortedError("fake upstream: dying mid-stream on request")
            if i == midway:  # an in-band error event, then the end (no [DONE])
                return await send({**_event({"error": {"message": "overloaded", "type":
                                   "server_error", "code": "overloaded"}}), "more_body": False})
            if itl and i and await _wait(disconnected, itl):
                return
            if await stalls.before_delta(i, send, disconnected, COMMENT_PING):
                return
            choice: dict[str, Any] = {"index": 0, "finish_reason": None}
            if chat:
                choice["delta"] = {"content": piece}
            else:
                choice["text"] = piece
            await send(_event({**base, "choices": [choice], **usage_extra}))
            rec.chunks_sent += 1
            if self.record_requests:
                self._touch()  # a test may be waiting for the count (wait_for)
        final: dict[str, Any] = {"index": 0, "finish_reason": "tool_calls" if call else
                                 headers.get("x-fake-finish", "stop")}
        final["delta" if chat else "text"] = {} if chat else ""
        await send(_event({**base, "choices": [final], **usage_extra}))
        if want_usage and headers.get("x-fake-usage") != "0":
            usage = _usage(data, len(pieces), sim)
            await send(_event({**base, "choices": [], "usage": usage}))
        tail = float(headers.get("x-fake-tail-ms", 0)) / 1000
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": bool(tail)})
        if tail:  # the body ends a while after its last event
            await asyncio.sleep(tail)
            await send({"type": "http.response.body", "body": b""})


def _event(obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": "http.response.body", "body": b"data: " + orjson.dumps(obj) + b"\n\n",
            "more_body": True}


async def _send_json(send: Send, status: int, obj: Any, rec: Record,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps(obj)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    rec.first_byte = time.monotonic()
    await send({"type": "http.response.body", "body": body})


def _prompt_tokens(data: Any) -> int:
    if not isinstance(data, dict):
        return 0
    messages = data.get("messages")
    if isinstance(messages, list):
        return sum(len(str(m.get("content", "")).split()) + 4 for m in messages if isinstance(m, dict))
    return len(str(data.get("prompt", "")).split())


def _usage(data: Any, completion: int, sim: PromptUsage | None = None) -> dict[str, Any]:
    prompt, cached = (sim.prompt_tokens, sim.cached_tokens) if sim else (_prompt_tokens(data), 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _completion(data: Any, headers: dict[str, str], chat: bool,
                sim: PromptUsage | None = None) -> dict[str, Any]:
    pieces = text_pieces(int(headers.get("x-fake-tokens", 8)), schema_of(data) if chat else None)
    text, n = "".join(pieces), len(pieces)
    model = data.get("model", "fake-model") if isinstance(data, dict) else "fake-model"
    out: dict[str, Any] = {"id": "chatcmpl-fake", "created": 1_700_000_000, "model": model}
    call = _tool_call(data, headers) if chat else None
    if call is not None:
        out["object"] = "chat.completion"
        out["choices"] = [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                           "message": {"role": "assistant", "content": None,
                                       "tool_calls": [call]}}]
        n = 1
    elif chat:
        out["object"] = "chat.completion"
        out["choices"] = [{"index": 0, "finish_reason": headers.get("x-fake-finish", "stop"),
                           "logprobs": None, "message": {"role": "assistant", "content": text}}]
    else:
        out["object"] = "text_completion"
        out["choices"] = [{"index": 0, "finish_reason": "stop", "logprobs": None, "text": text}]
    if headers.get("x-fake-usage") != "0":
        out["usage"] = _usage(data, n, sim)
    return out


def _embeddings(data: Any) -> dict[str, Any]:
    inputs = data.get("input", "") if isinstance(data, dict) else ""
    items = inputs if isinstance(inputs, list) else [inputs]
    vectors = [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]}
               for i in range(len(items))]
    return {"object": "list", "data": vectors, "model": data.get("model") if isinstance(data, dict)
            else None, "usage": {"prompt_tokens": len(items), "total_tokens": len(items)}}
