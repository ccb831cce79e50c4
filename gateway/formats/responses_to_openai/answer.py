"""A Chat Completions answer as a Responses answer. Pure, no I/O."""

from __future__ import annotations

from typing import Any

from gateway.errors import UpstreamError
from gateway.formats.answer import Answer
from gateway.formats.responses import response_object

__all__ = ["INCOMPLETE", "response_from_chat"]

#: Chat finish reasons a Responses answer reports as ``incomplete`` (as OpenAI does: the
#: output cut by its token limit or by a content filter).
INCOMPLETE = frozenset(("length", "content_filter"))


def response_from_chat(body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``response`` object of a ``chat.completion`` (parsed): its message as a message
    item, its tool calls as ``function_call`` items; ``length`` and ``content_filter`` as
    status ``incomplete`` (reason ``max_output_tokens``, ``content_filter``). ``request``: the Responses request it answers (echoed).
    Raises UpstreamError (502) for a body that is not a chat completion."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise UpstreamError("the upstream's answer is not a chat completion") from exc
    usage = body.get("usage") or {}
    content = message.get("content")
    answer = Answer(content if isinstance(content, str) else None,
                    choice.get("finish_reason") or "stop", body.get("model", ""),
                    message.get("tool_calls") or None, usage.get("prompt_tokens"),
                    usage.get("completion_tokens"))
    status = "incomplete" if choice.get("finish_reason") in INCOMPLETE else "completed"
    out = response_object(answer, body=request, status=status)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached:
        out["usage"]["input_tokens_details"]["cached_tokens"] = cached
    return out
