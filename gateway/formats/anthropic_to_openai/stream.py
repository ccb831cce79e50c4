"""An Anthropic client calling an OpenAI-compatible upstream, streamed: the upstream's
``chat.completion.chunk`` events become the Messages events an Anthropic client expects.
Pure, no I/O.

    AnthropicStreamFromOpenAI(model=None).feed(chunk) -> bytes, .flush() -> bytes

How bytes are cut into events, ``done`` and ``errored``: :mod:`gateway.formats.translator`.
Wire formats: https://platform.openai.com/docs/api-reference/chat-streaming and
https://docs.anthropic.com/en/docs/build-with-claude/streaming
"""

from __future__ import annotations

from typing import Any

from gateway.formats.anthropic import stop_reason_of
from gateway.formats.anthropic_to_openai.answer import usage_from_openai
from gateway.formats.ids import random_hex
from gateway.formats.translator import ChunkTranslator, tool_use_id
from llm_wire.sse import json_event

__all__ = ["AnthropicStreamFromOpenAI"]

# Anthropic's error types (https://docs.anthropic.com/en/api/errors); any other upstream
# error type is reported to an Anthropic client as ``api_error``.
_ANTHROPIC_ERRORS = frozenset({
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    "request_too_large", "rate_limit_error", "api_error", "overloaded_error", "billing_error",
    "timeout_error",
})


class AnthropicStreamFromOpenAI(ChunkTranslator):
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
      :func:`~gateway.formats.translator.tool_use_id`, as in a whole answer;
      ``name``, ``input: {}``); argument pieces -> ``input_json_delta``;
    - ``finish_reason`` and the usage chunk are remembered (usage through
      :func:`~gateway.formats.anthropic_to_openai.answer.usage_from_openai`);
    - ``[DONE]`` -> the open block's ``content_block_stop``, ``message_delta`` (``stop_reason``
      from :func:`~gateway.formats.anthropic.stop_reason_of`, null if no finish_reason came;
      usage ``{input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
      output_tokens}`` when known, else ``{output_tokens: 0}``), ``message_stop``;
    - an error (``{"error": {...}}``) -> ``event: error`` with ``{"type": "error", "error":
      {"type", "message"}}`` (an OpenAI type that Anthropic lacks becomes ``api_error``).

    How a chunk is read (choice 0 only: n > 1 has no Anthropic form):
    :class:`~gateway.formats.translator.ChunkTranslator`. A stream without ``[DONE]`` gets no
    ``message_stop``, even after a ``finish_reason`` (OpenAI-compatible servers send it).
    """

    __slots__ = ("_model", "_next", "_open", "_open_text", "_tools", "_usage")

    def __init__(self, model: str | None = None) -> None:
        super().__init__()
        self._model = model
        self._next = 0  # the next content block's index
        self._open: int | None = None  # the open block's index
        self._open_text = False
        self._tools: dict[Any, int] = {}  # OpenAI tool call index -> block index
        self._usage: dict[str, Any] | None = None

    def _error(self, obj: dict[str, Any]) -> bytes:
        error = obj.get("error") or obj
        error = error if isinstance(error, dict) else {"message": str(error)}
        type_ = error.get("type")
        return self._fail(type_ if type_ in _ANTHROPIC_ERRORS else "api_error",
                          str(error.get("message") or "upstream error"))

    def _take_usage(self, usage: dict[str, Any]) -> None:
        self._usage = usage_from_openai(usage)

    def head(self, model: str) -> bytes:
        """``message_start``, before the upstream's first chunk (so with a new id and
        ``model``, not the chunk's): an Anthropic client's stream opens with it as soon as
        the upstream accepts, as Anthropic's own streams do, instead of a prefill later."""
        if not self._started:
            self.early = self._start({"model": model})
        return self.early

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._started = True
        # The chunk id, traceable in both logs ("msg_" once, should it be one of ours).
        rest = str(chunk.get("id") or "").removeprefix("chatcmpl-").removeprefix("msg_")
        return json_event({"type": "message_start", "message": {
            "id": "msg_" + (rest or random_hex()), "type": "message", "role": "assistant",
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
