"""Cached answers: what is stored from an upstream response, and how a hit is served.

Pure functions. A stored answer is the assistant message and its token counts, taken from a
complete response (``finish_reason`` ``stop``, or ``tool_calls`` where the policy allows).
A hit is served as a ``chat.completion`` JSON body or, for streaming requests, as a proper
SSE stream (role chunk, content chunks, finish chunk, usage chunk when asked, ``[DONE]``)
that the openai SDK parses like any other. Wire format:
https://platform.openai.com/docs/api-reference/chat
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

__all__ = ["StreamCollector", "answer_from_json", "hit_body", "hit_events"]

_CHUNK_CHARS = 64


def _answer(message: dict[str, Any], finish: str, model: str,
            usage: dict[str, Any] | None, allow_tools: bool) -> bytes | None:
    tool_calls = message.get("tool_calls")
    if tool_calls and not allow_tools:
        return None
    if finish not in ("stop", "tool_calls") or (finish == "tool_calls" and not allow_tools):
        return None
    content = message.get("content")
    if not isinstance(content, str) and not tool_calls:
        return None
    usage = usage or {}
    return orjson.dumps({
        "content": content, "tool_calls": tool_calls or None, "finish_reason": finish,
        "model": model, "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    })


def answer_from_json(body: bytes, allow_tools: bool) -> bytes | None:
    """The storable answer of a non-streaming response body, or None (incomplete, an error,
    several choices, tool calls not allowed...)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or "error" in obj:
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    return _answer(message, str(choices[0].get("finish_reason")), str(obj.get("model", "")),
                   obj.get("usage") if isinstance(obj.get("usage"), dict) else None,
                   allow_tools)


class StreamCollector:
    """Rebuilds the assistant message from a stream's events, for storing after the end."""

    __slots__ = ("broken", "content", "model", "tool_calls")

    def __init__(self) -> None:
        self.content: list[str] = []
        self.tool_calls = False
        self.model = ""
        self.broken = False

    def feed(self, events: bytes) -> None:
        for event in events.split(b"\n\n"):
            if not event.startswith(b"data: {"):
                continue
            try:
                obj = orjson.loads(event[6:])
            except orjson.JSONDecodeError:
                self.broken = True
                continue
            self.model = obj.get("model") or self.model
            for choice in obj.get("choices") or ():
                if choice.get("index", 0) != 0:
                    self.broken = True  # n > 1: not cacheable
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    self.content.append(delta["content"])
                if delta.get("tool_calls"):
                    self.tool_calls = True

    def answer(self, finish: str | None, usage: dict[str, Any] | None) -> bytes | None:
        if self.broken or self.tool_calls or finish != "stop":
            return None  # streamed tool calls are not reassembled: never cached
        return _answer({"content": "".join(self.content)}, finish, self.model, usage, False)


def _usage(answer: dict[str, Any]) -> dict[str, Any]:
    prompt = answer.get("prompt_tokens") or 0
    completion = answer.get("completion_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": prompt}}


def hit_body(stored: bytes) -> bytes:
    """A ``chat.completion`` JSON body for a cache hit."""
    a = orjson.loads(stored)
    message: dict[str, Any] = {"role": "assistant", "content": a["content"], "refusal": None}
    if a.get("tool_calls"):
        message["tool_calls"] = a["tool_calls"]
    return orjson.dumps({
        "id": "chatcmpl-cache-" + uuid.uuid4().hex, "object": "chat.completion",
        "created": int(time.time()), "model": a["model"],
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": a["finish_reason"]}],
        "usage": _usage(a),
    })


def hit_events(stored: bytes, include_usage: bool) -> bytes:
    """The whole SSE stream of a cache hit (one write: it is already complete)."""
    a = orjson.loads(stored)
    base = {"id": "chatcmpl-cache-" + uuid.uuid4().hex, "object": "chat.completion.chunk",
            "created": int(time.time()), "model": a["model"]}

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**base, "choices": choices, **extra}) + b"\n\n"

    def choice(delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

    out = [event(choice({"role": "assistant", "content": ""}))]
    content = a.get("content") or ""
    for i in range(0, len(content), _CHUNK_CHARS):
        out.append(event(choice({"content": content[i:i + _CHUNK_CHARS]})))
    if a.get("tool_calls"):
        calls = [{**c, "index": i} for i, c in enumerate(a["tool_calls"])]
        out.append(event(choice({"tool_calls": calls})))
    out.append(event(choice({}, a["finish_reason"])))
    if include_usage:
        out.append(event([], usage=_usage(a)))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)
