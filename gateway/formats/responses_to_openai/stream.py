"""A Responses client calling a chat-only upstream, streamed: the upstream's
``chat.completion.chunk`` events become Responses' typed events. Pure, no I/O.

    ResponsesStreamFromChat(request).feed(chunk) -> bytes, .flush() -> bytes

Events, each with its ``event:`` line and a ``sequence_number`` counting from 0:

- the first chunk -> ``response.created`` and ``response.in_progress`` (the response
  ``in_progress``, no output yet);
- ``content`` -> on its first piece ``response.output_item.added`` (a message item) and
  ``response.content_part.added`` (an ``output_text`` part), then ``response.output_text.delta``;
- each new ``tool_calls`` index -> the open item done, ``response.output_item.added`` (a
  ``function_call`` item: ``call_id``, ``name``, and ``namespace`` for a namespaced tool,
  named as the request declared it: :class:`~gateway.formats.responses_tools.ToolNames`),
  argument pieces as ``response.function_call_arguments.delta``; for a custom tool, a
  ``custom_tool_call`` item, and its text's pieces as ``response.custom_tool_call_input.delta``
  (:class:`~gateway.formats.tool_input.InputStream`);
- ``[DONE]`` -> the open item done (``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``; or
  ``response.function_call_arguments.done`` (``response.custom_tool_call_input.done``) and
  ``response.output_item.done``), then
  ``response.completed`` with the whole response and its usage (``response.incomplete`` when
  the upstream stopped at its token limit);
- an upstream error -> an ``error`` event (``code``, ``message``), and nothing after it.

How bytes are cut into events, ``done`` and ``errored``: :mod:`gateway.formats.translator`;
a stream without ``[DONE]`` gets no ``response.completed``.
Wire formats: https://platform.openai.com/docs/api-reference/chat-streaming,
https://platform.openai.com/docs/api-reference/responses-streaming
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.formats.answer import Answer
from gateway.formats.ids import random_hex
from gateway.formats.responses import response_object
from gateway.formats.responses_to_openai.answer import INCOMPLETE
from gateway.formats.responses_tools import ToolNames, declared_tools
from gateway.formats.tool_input import InputStream
from gateway.formats.translator import ChunkTranslator
from llm_wire.sse import json_event

__all__ = ["ResponsesStreamFromChat"]

_DELTA = (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
          b'"sequence_number":%d,"item_id":"%b","output_index":%d,"content_index":0,'
          b'"delta":%b,"logprobs":[]}\n\n')


class ResponsesStreamFromChat(ChunkTranslator):
    """Chat Completions chunks in, Responses events out; ``request``: the Responses request
    (its settings are echoed in the response objects)."""

    __slots__ = ("_id", "_inputs", "_items", "_model", "_names", "_open", "_pieces", "_request",
                 "_seq", "_tools", "_usage")
    _invalid_type = "upstream_error"

    def __init__(self, request: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._request = request or {}
        self._id = "resp_" + random_hex()
        self._seq = 0
        self._model = ""
        self._items: list[dict[str, Any]] = []  # output items so far, in order
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._pieces: list[str] = []  # the open message's text so far
        self._tools: dict[Any, dict[str, Any]] = {}  # chat tool call index -> its item
        self._inputs: dict[str, InputStream] = {}  # a custom tool call's id -> its text
        self._names: ToolNames | None = None  # made at the first tool call
        self._usage: dict[str, Any] = {}

    def _emit(self, kind: str, fields: dict[str, Any]) -> bytes:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return json_event(event, kind)

    def _response(self, status: str) -> dict[str, Any]:
        answer = Answer(None, self._finish or "stop", self._model, None,
                        self._usage.get("prompt_tokens"), self._usage.get("completion_tokens"))
        obj = response_object(answer, self._id, status=status, body=self._request)
        obj["output"] = [dict(item) for item in self._items]
        if status == "in_progress":
            obj["usage"] = None
        else:
            details = self._usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens"):
                obj["usage"]["input_tokens_details"]["cached_tokens"] = details["cached_tokens"]
        return obj

    def _error(self, obj: dict[str, Any]) -> bytes:
        inner = obj.get("error")
        error: dict[str, Any] = inner if isinstance(inner, dict) else obj
        return self._fail(str(error.get("code") or error.get("type") or "upstream_error"),
                          str(error.get("message") or "upstream error"))

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._started = True
        self._model = str(chunk.get("model") or "")
        response = self._response("in_progress")  # the same object twice: each is dumped
        return self._emit("response.created", {"response": response}) \
            + self._emit("response.in_progress", {"response": response})

    def _take_usage(self, usage: dict[str, Any]) -> None:
        self._usage = usage

    def _add(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self._items.append(item)
        self._open = item
        return out + self._emit("response.output_item.added", {
            "output_index": len(self._items) - 1, "item": dict(item)})

    def _text(self, text: str) -> bytes:
        out = b""
        message = self._open
        if message is None or message["type"] != "message":
            message = {"type": "message", "id": "msg_" + random_hex(),
                       "status": "in_progress", "role": "assistant", "content": []}
            out += self._add(message)
            self._pieces = []
            out += self._emit("response.content_part.added", {
                "item_id": message["id"], "output_index": len(self._items) - 1,
                "content_index": 0, "part": {"type": "output_text", "text": "",
                                             "annotations": []}})
        self._pieces.append(text)
        seq, self._seq = self._seq, self._seq + 1
        # the one event per token: its bytes made directly (json_event of the same dict)
        return out + _DELTA % (seq, message["id"].encode(), len(self._items) - 1,
                               orjson.dumps(text))

    def _item(self, call: dict[str, Any], name: Any) -> dict[str, Any]:
        """The output item a new tool call opens, named as the request declared its tool."""
        if self._names is None:
            self._names = ToolNames(declared_tools(self._request))
        ref = self._names.ref(name) if isinstance(name, str) else None
        call_id = call.get("id") or "call_" + random_hex()
        if ref is not None and ref.custom:
            item: dict[str, Any] = {"type": "custom_tool_call", "id": "ctc_" + random_hex(),
                                    "call_id": call_id, "name": ref.name, "input": "",
                                    "status": "in_progress"}
            self._inputs[item["id"]] = InputStream()
        else:
            item = {"type": "function_call", "id": "fc_" + random_hex(), "call_id": call_id,
                    "name": ref.name if ref is not None else name or "", "arguments": "",
                    "status": "in_progress"}
        if ref is not None and ref.namespace is not None:
            item["namespace"] = ref.namespace
        return item

    def _tool(self, call: dict[str, Any]) -> bytes:
        key = call.get("index", len(self._tools))
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        out = b""
        item = self._tools.get(key)
        if item is None:
            item = self._tools[key] = self._item(call, function.get("name"))
            out = self._add(item)
        args = function.get("arguments")
        if not args or not isinstance(args, str):
            return out
        where = {"item_id": item["id"], "output_index": self._items.index(item)}
        stream = self._inputs.get(item["id"])
        if stream is None:
            item["arguments"] += args
            return out + self._emit("response.function_call_arguments.delta",
                                    {**where, "delta": args})
        text = stream.feed(args)
        return out + (self._emit("response.custom_tool_call_input.delta",
                                 {**where, "delta": text}) if text else b"")

    def _close(self) -> bytes:
        """The open item's closing events (b"" when none is open)."""
        item, self._open = self._open, None
        if item is None:
            return b""
        index = self._items.index(item)
        out = []
        if item["type"] == "message":
            text = "".join(self._pieces)
            part = {"type": "output_text", "text": text, "annotations": []}
            out.append(self._emit("response.output_text.done", {
                "item_id": item["id"], "output_index": index, "content_index": 0,
                "text": text, "logprobs": []}))
            out.append(self._emit("response.content_part.done", {
                "item_id": item["id"], "output_index": index, "content_index": 0,
                "part": part}))
            item["content"] = [part]
        elif item["type"] == "custom_tool_call":
            where = {"item_id": item["id"], "output_index": index}
            item["input"], rest = self._inputs.pop(item["id"]).rest()
            if rest:
                out.append(self._emit("response.custom_tool_call_input.delta",
                                      {**where, "delta": rest}))
            out.append(self._emit("response.custom_tool_call_input.done",
                                  {**where, "input": item["input"]}))
        else:
            out.append(self._emit("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index,
                "arguments": item["arguments"]}))
        item["status"] = "completed"
        out.append(self._emit("response.output_item.done", {"output_index": index,
                                                           "item": dict(item)}))
        return b"".join(out)

    def _end(self) -> bytes:
        out = self._close()  # every other item was closed when the next one opened
        self.done = True
        if self._finish in INCOMPLETE:
            return out + self._emit("response.incomplete", {"response": self._response(
                "incomplete")})
        return out + self._emit("response.completed", {"response": self._response(
            "completed")})

    def _fail(self, code: str, message: str) -> bytes:
        self.errored = True
        return self._emit("error", {"code": code, "message": message, "param": None})
