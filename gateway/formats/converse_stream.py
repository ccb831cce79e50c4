"""ConverseStream's events (as gateway.upstreams.bedrock_stream hands them on: ``event:
<type>`` and the event's JSON) as Anthropic's Messages stream, which the other translations
take from there. Pure, no I/O.

    messageStart                      -> message_start (usage 0: Converse gives it last)
    contentBlockStart (toolUse)       -> content_block_start (tool_use)
    contentBlockDelta text            -> content_block_start (text) first, text_delta
    contentBlockDelta toolUse.input   -> input_json_delta (the JSON tool's: text_delta)
    contentBlockDelta reasoningContent-> content_block_start (thinking) first,
                                         thinking_delta / signature_delta
    contentBlockStop                  -> content_block_stop
    messageStop                       -> (its stopReason kept)
    metadata                          -> message_delta (stop_reason, usage) and message_stop
    error (an exception frame)        -> passed on as Anthropic's error event

A stream that ends after ``messageStop`` without ``metadata`` still ends (its usage then
unknown); one cut before it gets no end, so the gateway reports it broken.
Source: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.formats.converse import JSON_TOOL, STOP_REASONS, usage_from_converse
from gateway.formats.ids import random_hex
from gateway.formats.translator import INVALID_EVENT, EventTranslator, load_object

__all__ = ["AnthropicStreamFromConverse"]


def _event(kind: str, fields: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) \
        + b"\n\n"


class AnthropicStreamFromConverse(EventTranslator):
    """One ConverseStream answer as Anthropic's events (``model``: the name its
    ``message_start`` carries)."""

    __slots__ = ("_json", "_model", "_open", "_stop")

    def __init__(self, model: str = "") -> None:
        super().__init__()
        self._model = model
        self._open: dict[int, str] = {}  # Converse block index -> the kind started
        self._json: set[int] = set()  # blocks of the structured output's tool: text
        self._stop: str | None = None

    def _event(self, name: str | None, data: bytes) -> bytes:
        obj = load_object(data)
        if obj is None:
            return self._fail(INVALID_EVENT)
        if name == "error" or obj.get("type") == "error":
            self.errored = True
            return _event("error", {"error": obj.get("error") or {"type": "api_error",
                                                                  "message": INVALID_EVENT}})
        if name == "messageStart":
            return _event("message_start", {"message": {
                "id": f"msg_bdrk_{random_hex()}", "type": "message", "role": "assistant",
                "model": self._model, "content": [], "stop_reason": None,
                "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}})
        index = obj.get("contentBlockIndex", 0)
        if name == "contentBlockStart":
            use = (obj.get("start") or {}).get("toolUse")
            if isinstance(use, dict) and use.get("name") == JSON_TOOL:
                self._json.add(index)
                return self._start(index, "text", {"type": "text", "text": ""})
            if isinstance(use, dict):
                return self._start(index, "tool_use", {
                    "type": "tool_use", "id": use.get("toolUseId"), "name": use.get("name"),
                    "input": {}})
            return b""
        if name == "contentBlockDelta":
            return self._delta(index, obj.get("delta") or {})
        if name == "contentBlockStop":
            return _event("content_block_stop", {"index": index}) \
                if self._open.pop(index, None) else b""
        if name == "messageStop":
            reason = obj.get("stopReason")
            self._stop = "end_turn" if self._json else STOP_REASONS.get(str(reason), "end_turn")
            return b""
        if name == "metadata":
            return self._end(usage_from_converse(obj.get("usage")))
        return b""

    def _start(self, index: int, kind: str, block: dict[str, Any]) -> bytes:
        self._open[index] = kind
        return _event("content_block_start", {"index": index, "content_block": block})

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        out = b""
        if isinstance(delta.get("text"), str):
            if index not in self._open:
                out = self._start(index, "text", {"type": "text", "text": ""})
            return out + _event("content_block_delta", {"index": index, "delta": {
                "type": "text_delta", "text": delta["text"]}})
        use = delta.get("toolUse")
        if isinstance(use, dict):
            piece = str(use.get("input", ""))
            kind = {"type": "text_delta", "text": piece} if index in self._json else \
                {"type": "input_json_delta", "partial_json": piece}
            return _event("content_block_delta", {"index": index, "delta": kind})
        reasoning = delta.get("reasoningContent")
        if isinstance(reasoning, dict):
            if index not in self._open:
                out = self._start(index, "thinking", {"type": "thinking", "thinking": "",
                                                      "signature": ""})
            if isinstance(reasoning.get("text"), str):
                out += _event("content_block_delta", {"index": index, "delta": {
                    "type": "thinking_delta", "thinking": reasoning["text"]}})
            if isinstance(reasoning.get("signature"), str):
                out += _event("content_block_delta", {"index": index, "delta": {
                    "type": "signature_delta", "signature": reasoning["signature"]}})
        return out

    def _end(self, usage: dict[str, Any]) -> bytes:
        if self._stop is None:  # metadata before messageStop: not Converse's order
            return self._fail(INVALID_EVENT)
        self.done = True
        closing = b"".join(_event("content_block_stop", {"index": i}) for i in self._open)
        self._open.clear()
        return closing + _event("message_delta", {
            "delta": {"stop_reason": self._stop, "stop_sequence": None}, "usage": usage}) \
            + _event("message_stop", {})

    def flush(self) -> bytes:
        out = super().flush()
        if not (self.done or self.errored) and self._stop is not None:
            out += self._end({})  # messageStop came, metadata did not: the end all the same
        return out

    def _fail(self, message: str) -> bytes:
        self.errored = True
        return _event("error", {"error": {"type": "api_error", "message": message}})
