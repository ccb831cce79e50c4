"""An OpenAI client calling an Anthropic upstream, streamed: the upstream's Messages events
become the ``chat.completion.chunk`` stream an OpenAI client expects. Pure, no I/O.

    OpenAIStreamFromAnthropic(model=None, created=None).feed(chunk) -> bytes, .flush() -> bytes

How bytes are cut into events, ``done`` and ``errored``: :mod:`gateway.formats.translator`.
Wire formats: https://docs.anthropic.com/en/docs/build-with-claude/streaming and
https://platform.openai.com/docs/api-reference/chat-streaming
"""

from __future__ import annotations

import time
from typing import Any

from gateway.formats.anthropic import finish_reason_of, usage_to_openai
from gateway.formats.ids import random_hex
from gateway.formats.openai_stream import chunk_event, chunk_head
from gateway.formats.translator import INVALID_EVENT, EventTranslator, load_object
from llm_wire.errors import error_body
from llm_wire.sse import DONE, data_event, json_event

__all__ = ["OpenAIStreamFromAnthropic"]

# The tail of a content chunk; the gateway's fast path counts `"finish_reason":null` per line.


class OpenAIStreamFromAnthropic(EventTranslator):
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
        obj = load_object(data)
        if obj is None:
            return self._fail("upstream_error", INVALID_EVENT)
        kind = obj.get("type") or name
        if not self._head and kind not in ("message_start", "error", "ping"):
            return self._fail("upstream_error", INVALID_EVENT)  # nothing may precede message_start
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
        self.id = "chatcmpl-" + str(message.get("id") or random_hex())
        self._base = {"id": self.id, "object": "chat.completion.chunk",
                      "created": self._created,
                      "model": self._model or message.get("model") or ""}
        self._head = chunk_head(self._base)
        return self._chunk({"role": "assistant", "content": ""})

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return chunk_event(self._head, delta, finish)

    def _fail(self, type_: str, message: str) -> bytes:
        self.errored = True
        return data_event(error_body(message, type_, type_))

