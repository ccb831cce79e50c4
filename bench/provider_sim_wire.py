"""The simulated provider's bytes: answers, SSE events and errors exactly as OpenAI Chat
Completions (https://platform.openai.com/docs/api-reference/chat/streaming) and Anthropic
Messages (https://docs.anthropic.com/en/api/messages-streaming, /errors) send them. Pure.

A stream is a list of (event bytes, tokens) pairs: ``tokens`` is how many answer tokens the
event carries (1 for a content delta, else 0), which the server paces at the model's speed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from bench.provider_sim_engine import Plan, SimError
from gateway.testing.fake_anthropic import _events

__all__ = ["Event", "anthropic_error", "anthropic_message", "anthropic_stream", "openai_completion",
           "openai_error", "openai_stream"]

Event = tuple[bytes, int]
_OPENAI_CODES = {401: "invalid_api_key", 404: "model_not_found"}


def openai_error(exc: SimError) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {429: "tokens", 500: "server_error", 503: "server_error"}.get(
        exc.status, "invalid_request_error")
    code = exc.kind if exc.status == 429 else _OPENAI_CODES.get(exc.status)
    return {"error": {"message": exc.message, "type": kind, "param": None, "code": code}}


def anthropic_error(exc: SimError, request_id: str) -> dict[str, Any]:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}, ...}``."""
    return {"type": "error", "error": {"type": exc.kind, "message": exc.message},
            "request_id": request_id}


def _openai_usage(plan: Plan, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": plan.prompt_tokens, "completion_tokens": completion,
            "total_tokens": plan.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": plan.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0,
                                          "rejected_prediction_tokens": 0}}


def _text(words: list[str]) -> str:
    return " ".join(words)


def openai_completion(plan: Plan, model: str) -> dict[str, Any]:
    """The whole ``chat.completion`` of a plan."""
    return {"id": f"chatcmpl-sim{uuid.uuid4().hex[:24]}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "system_fingerprint": "fp_sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": _text(
                plan.words), "refusal": None, "annotations": []}, "logprobs": None,
                "finish_reason": "stop" if plan.finished else "length"}],
            "usage": _openai_usage(plan, len(plan.words)), "service_tier": "default"}


def openai_stream(plan: Plan, model: str, include_usage: bool) -> list[Event]:
    """The ``chat.completion.chunk`` events, a token a delta, then ``[DONE]``; with
    ``stream_options.include_usage`` every chunk has ``usage: null`` and a last chunk with no
    choices carries the usage."""
    base = {"id": f"chatcmpl-sim{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model, "service_tier": "default",
            "system_fingerprint": "fp_sim"}
    tail = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _data({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": finish}], **tail})

    out: list[Event] = [(chunk({"role": "assistant", "content": "", "refusal": None}), 0)]
    out += [(chunk({"content": w if i == 0 else " " + w}), 1) for i, w in enumerate(plan.words)]
    out.append((chunk({}, "stop" if plan.finished else "length"), 0))
    if include_usage:
        out.append((_data({**base, "choices": [], "usage": _openai_usage(
            plan, len(plan.words))}), 0))
    out.append((b"data: [DONE]\n\n", 0))
    return out


def anthropic_message(plan: Plan, model: str) -> dict[str, Any]:
    """The whole ``message`` of a plan."""
    usage = {**plan.usage_extra, "output_tokens": len(plan.words), "service_tier": "standard"}
    return {"id": f"msg_sim{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant",
            "model": model, "content": [{"type": "text", "text": _text(plan.words)}],
            "stop_reason": "end_turn" if plan.finished else "max_tokens",
            "stop_sequence": None, "usage": usage}


def anthropic_stream(plan: Plan, model: str) -> list[Event]:
    """message_start, ping, the text block a token a delta, message_delta, message_stop."""
    out: list[Event] = []
    for event, obj in _events(anthropic_message(plan, model)):
        body = b"event: " + event.encode() + b"\ndata: " + orjson.dumps({"type": event, **obj})
        out.append((body + b"\n\n", 1 if event == "content_block_delta" else 0))
    return out


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"
