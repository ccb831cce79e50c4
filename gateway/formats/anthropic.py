"""The Anthropic Messages wire format: requests in, answers and errors out. Pure, no I/O.

Wire format: https://docs.anthropic.com/en/api/messages (streaming:
https://docs.anthropic.com/en/docs/build-with-claude/streaming).
"""

from __future__ import annotations

from typing import Any

__all__ = ["finish_reason_of", "stop_reason_of", "usage_from_openai", "usage_to_openai"]

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop",
           "model_context_window_exceeded": "length"}
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
         "function_call": "tool_use", "content_filter": "refusal"}


def finish_reason_of(stop_reason: str | None) -> str | None:
    """OpenAI's ``finish_reason`` for an Anthropic ``stop_reason`` (None stays None)."""
    if stop_reason is None:
        return None
    return _FINISH.get(stop_reason, "stop")


def stop_reason_of(finish_reason: str | None) -> str | None:
    """Anthropic's ``stop_reason`` for an OpenAI ``finish_reason`` (None stays None)."""
    if finish_reason is None:
        return None
    return _STOP.get(finish_reason, "end_turn")


def usage_to_openai(usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic usage -> OpenAI usage. Anthropic's ``input_tokens`` excludes the prompt
    tokens read from or written to its cache; OpenAI's ``prompt_tokens`` counts all input,
    with the cache reads in ``prompt_tokens_details.cached_tokens``."""
    read = usage.get("cache_read_input_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + read + written
    completion = usage.get("output_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": read}}


def usage_from_openai(usage: dict[str, Any]) -> dict[str, Any]:
    """OpenAI usage -> Anthropic usage (cache reads split out of ``input_tokens``; OpenAI
    reports no cache writes)."""
    details = usage.get("prompt_tokens_details")
    read = (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    prompt = usage.get("prompt_tokens") or 0
    return {"input_tokens": max(prompt - read, 0), "output_tokens":
            usage.get("completion_tokens") or 0, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": read}
