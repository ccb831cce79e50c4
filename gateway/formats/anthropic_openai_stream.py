"""Stream translators between OpenAI chunk streams and Anthropic Messages streams. Pure, no I/O.

- :class:`OpenAIStreamFromAnthropic`: an Anthropic upstream's events -> the
  ``chat.completion.chunk`` stream an OpenAI client expects.
- :class:`AnthropicStreamFromOpenAI`: an OpenAI-compatible upstream's chunks -> the Messages
  events an Anthropic client expects.

Both are fed the upstream's raw bytes (cut anywhere, LF or CRLF line ends) and return whole
translated events: ``feed(chunk) -> bytes`` (b"" when nothing is complete yet), then
``flush() -> bytes`` at the end of the upstream body. ``done`` turns True once the terminal
event (``[DONE]`` / ``message_stop``) was emitted, and only when the upstream sent its own
terminator: a stream cut short gets no terminator, so the gateway can report it as broken.
An upstream error event (or an event that is not JSON, or out of order) becomes the caller's
error event and sets ``errored``; nothing is emitted after it. Nothing is raised.

Wire formats: https://platform.openai.com/docs/api-reference/chat-streaming and
https://docs.anthropic.com/en/docs/build-with-claude/streaming
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from gateway.formats.anthropic import (
    finish_reason_of,
    stop_reason_of,
    usage_from_openai,
    usage_to_openai,
)
from gateway.formats.anthropic_openai_answers import tool_use_id
from llm_wire.errors import error_body
from llm_wire.sse import DONE, Event, EventReader, data_event, json_event

__all__ = ["AnthropicStreamFromOpenAI", "OpenAIStreamFromAnthropic"]

# Anthropic's error types (https://docs.anthropic.com/en/api/errors); any other upstream
# error type is reported to an Anthropic client as ``api_error``.
_ANTHROPIC_ERRORS = frozenset({
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    "request_too_large", "rate_limit_error", "api_error", "overloaded_error", "billing_error",
    "timeout_error",
})
_INVALID = "upstream sent an invalid stream event"
# The tail of a content chunk; the gateway's fast path counts `"finish_reason":null` per line.
_OPEN_TAIL = b',"logprobs":null,"finish_reason":null}]}\n\n'


def _load(data: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class _Translator:
    """Cuts the upstream's bytes into events and hands each to ``_event`` until the stream
    ends (``done``) or fails (``errored``)."""

    __slots__ = ("_reader", "done", "errored")

    def __init__(self) -> None:
        self._reader = EventReader()
        self.done = False
        self.errored = False

    def feed(self, chunk: bytes) -> bytes:
        """Take upstream bytes; return the translated events completed so far (may be b"")."""
        if self.done or self.errored:
            return b""
        return self._translate(self._reader.feed(chunk))

    def flush(self) -> bytes:
        """At the end of the upstream body: what its unterminated last event translates to.
        Never a terminator the upstream did not send."""
        if self.done or self.errored:
            return b""
        return self._translate(self._reader.flush())

    def _translate(self, events: list[Event]) -> bytes:
        out = []
        for name, data in events:
            piece = self._event(name, data)
            if piece:
                out.append(piece)
            if self.done or self.errored:
                break
        return b"".join(out)

    def _event(self, name: str | None, data: bytes) -> bytes:
        raise NotImplementedError


class OpenAIStreamFromAnthropic(_Translator):
    """Anthropic Messages events in, OpenAI ``chat.completion.chunk`` events out.

    ``model``: the model name to report (None: the upstream's); ``created``: the chunks'
    ``created`` (Unix seconds; None: now). Each chunk is one ``data:`` line of orjson
    (no spaces), ``{"id": "chatcmpl-<message id>", "object": "chat.completion.chunk",
    "created", "model", "choices": [{"index": 0, "delta", "logprobs": null,
    "finish_reason"}]}``:

    - ``message_start`` -> the role chunk, ``delta: {"role": "assistant", "content": ""}``;
    - ``text_delta`` -> ``delta: {"content": text}``;
    - a ``tool_use`` block's start -> ``delta: {"tool_calls": [{"index": i, "id", "type":
      "function", "function": {"name", "arguments": ""}}]}`` (i counts tool calls from 0),
      its ``input_json_delta`` -> ``{"tool_calls": [{"index": i, "function":
      {"arguments": partial_json}}]}``;
    - ``message_delta`` -> the finish chunk (``delta: {}``, ``finish_reason`` from
      :func:`~gateway.formats.anthropic.finish_reason_of`); its usage updates the start's;
    - ``message_stop`` -> the usage-only chunk (``"choices": []``, usage from
      :func:`~gateway.formats.anthropic.usage_to_openai`: ``prompt_tokens`` counts cache
      reads and writes, ``prompt_tokens_details.cached_tokens`` the reads), always sent (the
      gateway drops it for clients that did not ask), then ``data: [DONE]``;
    - ``error`` -> ``data: {"error": {"message", "type", "param": null, "code"}}`` with
      ``type`` and ``code`` both the Anthropic error type (``overloaded_error``...).

    Thinking, signatures, redacted thinking, server tools, citations, pings and unknown
    event types are dropped.
    """

    __slots__ = ("_base", "_created", "_head", "_model", "_tools", "_usage", "id")

    def __init__(self, model: str | None = None, created: int | None = None) -> None:
        super().__init__()
        self._model = model
        self._created = int(time.time()) if created is None else created
        self._head = b""  # the chunk's JSON up to the delta, set by message_start
        self._base: dict[str, Any] = {}
        self._tools: dict[Any, int] = {}  # Anthropic block index -> OpenAI tool call index
        self._usage: dict[str, Any] = {}
        self.id = ""

    def _event(self, name: str | None, data: bytes) -> bytes:
        if not data:
            return b""
        obj = _load(data)
        if obj is None:
            return self._fail("upstream_error", _INVALID)
        kind = obj.get("type") or name
        if not self._head and kind not in ("message_start", "error", "ping"):
            return self._fail("upstream_error", _INVALID)  # nothing may precede message_start
        if kind == "content_block_delta":  # the hot path: almost every event is one
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return b""
            if delta.get("type") == "text_delta":
                text = delta.get("text")
                return self._chunk({"content": text}) if text else b""
            if delta.get("type") == "input_json_delta":
                i = self._tools.get(obj.get("index"))
                part = delta.get("partial_json")
                if i is None or not part:
                    return b""
                return self._chunk({"tool_calls": [{"index": i, "function": {
                    "arguments": part}}]})
            return b""
        if kind == "error":
            error = obj.get("error")
            error = error if isinstance(error, dict) else {}
            type_ = str(error.get("type") or "api_error")
            return self._fail(type_, str(error.get("message") or "upstream error"))
        if kind == "message_start":
            return self._start(obj.get("message"))
        if kind == "content_block_start":
            block = obj.get("content_block")
            if not isinstance(block, dict) or block.get("type") != "tool_use":
                return b""
            i = self._tools[obj.get("index")] = len(self._tools)
            return self._chunk({"tool_calls": [{"index": i, "id": block.get("id"),
                                                "type": "function", "function": {
                                                    "name": block.get("name"),
                                                    "arguments": ""}}]})
        if kind == "message_delta":
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self._usage.update((k, v) for k, v in usage.items() if v is not None)
            delta = obj.get("delta")
            stop = delta.get("stop_reason") if isinstance(delta, dict) else None
            return self._chunk({}, finish_reason_of(stop) or "stop")
        if kind == "message_stop":
            self.done = True
            return json_event({**self._base, "choices": [],
                               "usage": usage_to_openai(self._usage)}) + DONE
        return b""

    def _start(self, message: Any) -> bytes:
        message = message if isinstance(message, dict) else {}
        usage = message.get("usage")
        self._usage = dict(usage) if isinstance(usage, dict) else {}
        self.id = "chatcmpl-" + str(message.get("id") or uuid.uuid4().hex)
        self._base = {"id": self.id, "object": "chat.completion.chunk",
                      "created": self._created,
                      "model": self._model or message.get("model") or ""}
        self._head = orjson.dumps(self._base)[:-1] + b',"choices":[{"index":0,"delta":'
        return self._chunk({"role": "assistant", "content": ""})

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        if finish is None:
            return b"data: " + self._head + orjson.dumps(delta) + _OPEN_TAIL
        return (b"data: " + self._head + orjson.dumps(delta)
                + b',"logprobs":null,"finish_reason":' + orjson.dumps(finish) + b"}]}\n\n")

    def _fail(self, type_: str, message: str) -> bytes:
        self.errored = True
        return data_event(error_body(message, type_, type_))


class AnthropicStreamFromOpenAI(_Translator):
    """OpenAI ``chat.completion.chunk`` events in, Anthropic Messages events out.

    ``model``: the model name to report (None: the upstream's). Every event carries its
    ``event:`` line, as Anthropic sends them:

    - the first chunk -> ``message_start`` (id ``"msg_"`` + the chunk id without its
      ``chatcmpl-`` (and ``msg_``) prefix, or a new uuid hex; ``content: []``; usage ``{input_tokens: 0,
      output_tokens: 0}``: the real counts arrive only with the last chunk, and go into
      ``message_delta``, from which the anthropic SDK takes them);
    - ``content`` -> a text block (``content_block_start`` with ``{"type": "text",
      "text": ""}`` on its first piece), then ``text_delta`` events;
    - each new ``tool_calls`` index -> the open block closed, a ``tool_use`` block started
      (``id`` made safe for Anthropic by
      :func:`~gateway.formats.anthropic_openai_answers.tool_use_id`, as in a whole answer;
      ``name``, ``input: {}``); argument pieces -> ``input_json_delta``;
    - ``finish_reason`` and the usage chunk are remembered (usage through
      :func:`~gateway.formats.anthropic.usage_from_openai`);
    - ``[DONE]`` -> the open block's ``content_block_stop``, ``message_delta`` (``stop_reason``
      from :func:`~gateway.formats.anthropic.stop_reason_of`, null if no finish_reason came;
      usage ``{input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
      output_tokens}`` when known, else ``{output_tokens: 0}``), ``message_stop``;
    - an error (``{"error": {...}}``) -> ``event: error`` with ``{"type": "error", "error":
      {"type", "message"}}`` (an OpenAI type that Anthropic lacks becomes ``api_error``).

    Choices other than index 0 (n > 1 has no Anthropic form), empty content, ``refusal`` and
    ``reasoning_content`` deltas are dropped. A stream without ``[DONE]`` gets no
    ``message_stop``, even after a ``finish_reason`` (OpenAI-compatible servers send it).
    """

    __slots__ = ("_finish", "_model", "_next", "_open", "_open_text", "_started", "_tools",
                 "_usage")

    def __init__(self, model: str | None = None) -> None:
        super().__init__()
        self._model = model
        self._started = False
        self._next = 0  # the next content block's index
        self._open: int | None = None  # the open block's index
        self._open_text = False
        self._tools: dict[Any, int] = {}  # OpenAI tool call index -> block index
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None

    def _event(self, name: str | None, data: bytes) -> bytes:
        if data == b"[DONE]":
            return self._end()
        if not data:
            return b""
        obj = _load(data)
        if obj is None:
            return self._fail("api_error", _INVALID)
        if name == "error" or obj.get("error") or obj.get("object") == "error":
            error = obj.get("error") or obj
            error = error if isinstance(error, dict) else {"message": str(error)}
            type_ = error.get("type")
            return self._fail(type_ if type_ in _ANTHROPIC_ERRORS else "api_error",
                              str(error.get("message") or "upstream error"))
        out = [] if self._started else [self._start(obj)]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._usage = usage_from_openai(usage)
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                text = delta.get("content")
                if text and isinstance(text, str):
                    out.append(self._text(text))
                for call in delta.get("tool_calls") or ():
                    if isinstance(call, dict):
                        out.append(self._tool(call))
            if choice.get("finish_reason"):
                self._finish = str(choice["finish_reason"])
        return b"".join(out)

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._started = True
        # The chunk id, traceable in both logs ("msg_" once, should it be one of ours).
        rest = str(chunk.get("id") or "").removeprefix("chatcmpl-").removeprefix("msg_")
        return json_event({"type": "message_start", "message": {
            "id": "msg_" + (rest or uuid.uuid4().hex), "type": "message", "role": "assistant",
            "model": self._model or chunk.get("model") or "", "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}, "message_start")

    def _text(self, text: str) -> bytes:
        out = b""
        if not self._open_text:
            out = self._open_block({"type": "text", "text": ""})
            self._open_text = True
        return out + json_event({"type": "content_block_delta", "index": self._open, "delta": {
            "type": "text_delta", "text": text}}, "content_block_delta")

    def _tool(self, call: dict[str, Any]) -> bytes:
        key = call.get("index")
        if key is None:  # some servers send whole calls without an index: a new id, a new call
            key = len(self._tools) if call.get("id") or not self._tools else len(self._tools) - 1
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        out = b""
        block = self._tools.get(key)
        if block is None:
            out = self._open_block({"type": "tool_use", "id": tool_use_id(call.get("id")),
                                    "name": function.get("name") or "", "input": {}})
            block = self._tools[key] = self._next - 1
        args = function.get("arguments")
        if not args or not isinstance(args, str):
            return out
        # Deltas name their block, so the rare interleaved call still lands in its own block.
        return out + json_event({"type": "content_block_delta", "index": block, "delta": {
            "type": "input_json_delta", "partial_json": args}}, "content_block_delta")

    def _open_block(self, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._open, self._next = self._next, self._next + 1
        return out + json_event({"type": "content_block_start", "index": self._open,
                                 "content_block": block}, "content_block_start")

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open, self._open_text = self._open, None, False
        return json_event({"type": "content_block_stop", "index": index}, "content_block_stop")

    def _end(self) -> bytes:
        out = b"" if self._started else self._start({})
        u = self._usage
        usage = {"output_tokens": 0} if u is None else {
            "input_tokens": u["input_tokens"],
            "cache_creation_input_tokens": u["cache_creation_input_tokens"],
            "cache_read_input_tokens": u["cache_read_input_tokens"],
            "output_tokens": u["output_tokens"]}
        self.done = True
        return out + self._close() + json_event({
            "type": "message_delta", "delta": {"stop_reason": stop_reason_of(self._finish),
                                               "stop_sequence": None},
            "usage": usage}, "message_delta") + json_event(
            {"type": "message_stop"}, "message_stop")

    def _fail(self, type_: str, message: str) -> bytes:
        self.errored = True
        return json_event({"type": "error", "error": {"type": type_, "message": message}},
                          "error")
