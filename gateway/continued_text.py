"""What a continued stream has said so far, and its events as the client is to read them
(:mod:`gateway.continuation`; pure, I/O-free): the answer's text (what a continuation is
given to go on with), whether it can be continued at all (not in a tool call, a
reasoning/thinking block or a refusal, not past its finish, not with n > 1), and, once a
continuation answers, its events rewritten to follow the first attempt's: its opening
(role chunk, ``message_start``, the open text block's ``content_block_start``) dropped,
chunk ids and block indexes the first attempt's, the whitespace held back from a prefill
dropped where it repeats it, usage summed with what the cut attempts spent.

Wire formats: https://platform.openai.com/docs/api-reference/chat-streaming,
https://docs.anthropic.com/en/docs/build-with-claude/streaming
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import UpstreamError
from llm_wire.sse import cut_events, parse_event

__all__ = ["InBandError", "Transcript"]

_BLOCKING = ("tool_calls", "function_call", "reasoning_content", "reasoning", "refusal")


class InBandError(UpstreamError):
    """An error event the upstream sent in its stream: ``event``, its bytes (one whole SSE
    event), for the client where no continuation follows (its type kept, as without one)."""

    def __init__(self, message: str, event: bytes) -> None:
        super().__init__(message)
        self.event = event


class _Broken(Exception):
    """An in-band error event: the attempt failed (args: what goes out before it, the event)."""


class Transcript:
    """One continued stream's events in ``api``'s wire format (``openai`` chat chunks or
    ``anthropic`` Messages events), as they pass: :meth:`taken` on each chunk;
    :meth:`cut` when an attempt failed, :meth:`follow` when its continuation answers."""

    def __init__(self, api: str) -> None:
        self._api = api
        self._rest = b""
        self._parts: list[str] = []  # the answer's text the client has had
        self.blocked: str | None = None  # why it cannot be continued
        self.ended = self.finished = False
        self._id: Any = None  # the first attempt's chunk id
        self._spent: list[tuple[int | None, int]] = []  # (prompt, completion) of cut attempts
        self._attempt_prompt: int | None = None
        self._events = 0  # content events of the current attempt
        self._follow = False  # relaying a continuation
        self._skip_ws = ""  # whitespace held back from a prefill, to drop once repeated
        self._offset, self._drop_start, self._open = 0, False, -1
        self._blocks = 0  # Anthropic content blocks the client has had

    @property
    def text(self) -> str:
        """The answer's text the client has had (joined when asked: at a failure)."""
        return "".join(self._parts)

    def taken(self, chunk: bytes) -> tuple[bytes, UpstreamError | None]:
        """What of ``chunk`` goes to the client (whole events; the rest kept for the next),
        and the failure an in-band error event in it is, if any."""
        try:
            return self.feed(chunk), None
        except _Broken as exc:
            self._rest = b""
            return exc.args[0], InBandError("the upstream sent an error event mid-stream",
                                            exc.args[1])

    def cut(self, held: str) -> int:
        """The current attempt failed; ``held``: the text's end left out of the prefill
        (whitespace), to drop where the continuation repeats it. Returns the completion
        tokens spent so far (content events: a token each on OpenAI-compatible servers)."""
        self._spent.append((self._attempt_prompt, self._events))
        self._attempt_prompt, self._events, self._skip_ws = None, 0, held
        return sum(c for _, c in self._spent)

    def follow(self) -> None:
        """A continuation answers: its events follow the client's stream from here."""
        self._follow, self._rest = True, b""
        if self._api == "anthropic":  # the open text block goes on; a closed one is followed
            self._drop_start = self._open >= 0
            self._offset = self._open if self._open >= 0 else self._blocks

    def feed(self, chunk: bytes) -> bytes:
        """``chunk``'s whole events as they go to the client (the rest kept for the next);
        raises _Broken (with what goes out before it) on an error event."""
        block, self._rest = cut_events(self._rest + chunk)
        if not block:
            return b""
        out = []
        for raw in block[:-2].split(b"\n\n"):
            name, data = parse_event(raw)
            if not data and name is None:
                out.append(raw + b"\n\n")  # a comment
                continue
            try:
                kept = self._anthropic(name, data, raw) if self._api == "anthropic" \
                    else self._openai(data, raw)
            except _Broken:
                raise _Broken(b"".join(out), raw + b"\n\n") from None
            if kept is not None:
                out.append(kept + b"\n\n")
        return b"".join(out)

    def _openai(self, data: bytes, raw: bytes) -> bytes | None:
        if data == b"[DONE]":
            self.ended = True
            return raw
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return raw
        if not isinstance(obj, dict):
            return raw
        if "error" in obj:
            raise _Broken
        if self._id is None:
            self._id = obj.get("id")
        changed = False
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if choice.get("index", 0) != 0:
                self.blocked = "choices"
            if choice.get("finish_reason") is not None:
                self.finished = True
            if not isinstance(delta, dict):
                continue
            if any(delta.get(k) for k in _BLOCKING):
                self.blocked = self.blocked or "tool_call_or_reasoning"
            if self._follow and "role" in delta:
                del delta["role"]
                changed = True
            content = delta.get("content")
            if isinstance(content, str) and content:
                if self._skip_ws:
                    delta["content"] = content = self._skip(content)
                    changed = True
                self._parts.append(content)
                self._events += 1
        if not self._follow:
            return raw
        if (choices := obj.get("choices")) and not obj.get("usage") and all(
                isinstance(c, dict) and c.get("finish_reason") is None
                and not any((c.get("delta") or {}).values()) for c in choices):
            return None  # the continuation's role chunk
        if obj.get("id") != self._id:
            obj["id"], changed = self._id, True
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self._sum_openai(usage)
            changed = True
        return b"data: " + orjson.dumps(obj) if changed else raw

    def _sum_openai(self, usage: dict[str, Any]) -> None:
        now, completion = usage["prompt_tokens"], int(usage.get("completion_tokens") or 0)
        before = sum(c for _, c in self._spent)
        base, prompts, so_far = max(now - before, 0), 0, 0
        for prompt, spent in self._spent:  # each cut attempt's prompt: the first's + text
            prompts += prompt if prompt is not None else base + so_far
            so_far += spent
        usage["prompt_tokens"] = now + prompts
        usage["completion_tokens"] = completion + before
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

    def _anthropic(self, name: str | None, data: bytes, raw: bytes) -> bytes | None:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return raw
        kind = name or (obj.get("type") if isinstance(obj, dict) else None)
        if not isinstance(obj, dict) or kind in ("ping", None):
            return raw
        if kind == "error":
            raise _Broken
        if kind == "message_start":
            usage = (obj.get("message") or {}).get("usage") or {}
            if isinstance(usage.get("input_tokens"), int):
                self._attempt_prompt = usage["input_tokens"]
            return None if self._follow else raw
        if kind == "message_stop":
            self.ended = True
            return raw
        if kind == "message_delta":
            self.finished = True
            usage = obj.get("usage")
            if self._follow and isinstance(usage, dict):
                usage["output_tokens"] = int(usage.get("output_tokens") or 0) + sum(
                    c for _, c in self._spent)
                now = self._attempt_prompt or 0
                usage["input_tokens"] = now + sum(p or 0 for p, _ in self._spent)
                return _event(kind, obj)
            return raw
        index = obj.get("index")
        if not isinstance(index, int):
            return raw
        if kind == "content_block_start":
            block = obj.get("content_block") or {}
            if block.get("type") != "text":
                self.blocked = self.blocked or "tool_use_or_thinking"
            if self._follow and self._drop_start and index == 0:
                return None
            self._open = index + self._offset if self._follow else index
            self._blocks = max(self._blocks, self._open + 1)
        elif kind == "content_block_stop":
            self._open = -1
        elif kind == "content_block_delta":
            delta = obj.get("delta") or {}
            if delta.get("type") != "text_delta":
                self.blocked = self.blocked or "tool_use_or_thinking"
            elif isinstance(text := delta.get("text"), str):
                if self._skip_ws:
                    delta["text"] = text = self._skip(text)
                self._parts.append(text)
                self._events += 1
        if self._follow:
            obj["index"] = index + self._offset
            return _event(kind, obj)
        return raw

    def _skip(self, text: str) -> str:
        """``text`` without the start that repeats the whitespace held back from a prefill."""
        ws, n = self._skip_ws, 0
        while n < len(ws) and n < len(text) and text[n] == ws[n]:
            n += 1
        self._skip_ws = ws[n:] if n == len(text) else ""
        return text[n:]


def _event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj)
