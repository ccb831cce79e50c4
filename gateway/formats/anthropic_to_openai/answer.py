"""An Anthropic client calling an OpenAI-compatible upstream: the upstream's complete answer
becomes a Messages response body, its error an Anthropic error. Pure, no I/O.

    anthropic_response(completion, model=None) -> the Messages response (a dict)
    anthropic_error(status, error)             -> (status, the Anthropic error object)
    usage_from_openai(usage)                   -> Anthropic usage (also for the stream)

The first two take the upstream's body already parsed (dispatch parses it once, and
serialises what they return).

Stop reasons and error types by status are mapped by :mod:`gateway.formats.anthropic`.
Sources: https://docs.anthropic.com/en/api/messages, https://docs.anthropic.com/en/api/errors,
https://platform.openai.com/docs/api-reference/chat/object,
https://platform.openai.com/docs/guides/error-codes
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.errors import UpstreamError
from gateway.formats.anthropic import SYSTEM_ROLE_REFUSED, error_type_of, stop_reason_of
from gateway.formats.ids import random_hex
from gateway.formats.translator import tool_use_id

__all__ = ["anthropic_error", "anthropic_response", "usage_from_openai"]


def usage_from_openai(usage: dict[str, Any]) -> dict[str, Any]:
    """OpenAI usage -> Anthropic usage (cache reads split out of ``input_tokens``; OpenAI
    reports no cache writes)."""
    details = usage.get("prompt_tokens_details")
    read = (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    prompt = usage.get("prompt_tokens") or 0
    return {"input_tokens": max(prompt - read, 0), "output_tokens":
            usage.get("completion_tokens") or 0, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": read}


def anthropic_response(completion: Any, model: str | None = None) -> dict[str, Any]:
    """The Messages response for an OpenAI ``chat.completion`` (its parsed 200 body).

    ``{id: "msg_" + the completion id without its "chatcmpl-" (and "msg_") prefix, or a new
    one, type "message", role "assistant", model: ``model`` or the body's, content: [a text
    block (or the refusal) when there is text, tool_use blocks], stop_reason, stop_sequence:
    null, usage}``.
    Tool call arguments that are not a JSON object become ``input: {}`` (the client's tool
    reports the missing arguments better than a failed answer would). A tool call answered
    with ``finish_reason: "stop"`` (some servers do) gets ``stop_reason: "tool_use"``, which
    Anthropic tool loops wait for. Reasoning text (``reasoning_content``) is dropped: an
    Anthropic thinking block needs a signature. Raises UpstreamError (502) for a body that
    is not a completion (None: not JSON).
    """
    try:
        choice = completion["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise UpstreamError("the upstream's answer is not a chat.completion") from exc
    content: list[dict[str, Any]] = []
    text = message.get("content") or message.get("refusal")
    if isinstance(text, list):  # content parts, as a few servers answer
        text = "".join(part.get("text") or "" for part in text)
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {}
        content.append({"type": "tool_use", "id": tool_use_id(call.get("id")),
                        "name": function.get("name", ""),
                        "input": arguments if isinstance(arguments, dict) else {}})
    stop = stop_reason_of(choice.get("finish_reason")) or "end_turn"
    if stop == "end_turn" and any(block["type"] == "tool_use" for block in content):
        stop = "tool_use"
    id_ = completion.get("id")
    rest = id_.removeprefix("chatcmpl-").removeprefix("msg_") if isinstance(id_, str) else ""
    return {
        "id": "msg_" + (rest or random_hex()), "type": "message", "role": "assistant",
        "model": model if model is not None else completion.get("model", ""),
        "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": usage_from_openai(completion.get("usage") or {}),
    }


# -- errors ----------------------------------------------------------------------------------

def _error_message(obj: Any) -> str | None:
    """The message of an OpenAI error body (or of the shapes vLLM and FastAPI answer with)."""
    if not isinstance(obj, dict):
        return None
    error = obj.get("error")
    for found in (error.get("message") if isinstance(error, dict) else error,
                  obj.get("message"), obj.get("detail")):
        if isinstance(found, str) and found:
            return found
    return None


#: An upstream's 400 saying it takes no system message where one sits: vLLM and SGLang answer
#: with the chat template's own words (Qwen3's "System message must be at the beginning.",
#: Mistral's "... with the exception of an initial optional system message!").
_SYSTEM_PLACEMENT = re.compile(
    r"system (message|prompt)s? (must|should|can only) (be|appear|come)"
    r"( at the (beginning|start)| first)"
    r"|initial (optional )?system message"
    r"|role\W{0,3}system\W{0,3}(is )?not (supported|allowed)", re.IGNORECASE)


#: A context overflow in the words of OpenAI-compatible servers (OpenAI and older vLLM; newer
#: vLLM; SGLang; the local engine): the prompt's tokens, ``max_tokens`` when it counted, the
#: model's context length.
_OVERFLOWS = tuple(re.compile(pattern) for pattern in (
    (r"maximum context length is (?P<limit>\d+) tokens\. However, you requested \d+ tokens "
     r"\((?P<input>\d+) in the messages, (?P<max>\d+) in the completion\)"),
    (r"maximum context length is (?P<limit>\d+) tokens\. However, your (request has|messages "
     r"resulted in) (?P<input>\d+) (input )?tokens"),
    (r"is too large: (?P<max>\d+)\. This model's maximum context length is (?P<limit>\d+) "
     r"tokens and your request has (?P<input>\d+) input tokens"),
    (r"maximum context length of (?P<limit>\d+) tokens\. You requested a total of \d+ tokens: "
     r"(?P<input>\d+) tokens from the input messages and (?P<max>\d+) tokens for the "
     r"completion"),
    r"the prompt has (?P<input>\d+) tokens; this model's context length is (?P<limit>\d+)",
))


def _in_anthropics_words(message: str) -> str | None:
    """Anthropic's words for what an upstream's 400 says, when a client acts on them: a
    system message refused where it sits; a context overflow, as Anthropic reports it
    ("prompt is too long: N tokens > L maximum", or, when ``max_tokens`` is what overflows,
    "input length and `max_tokens` exceed context limit: N + M > L, ..."), which Claude Code
    reads to compact the conversation or lower ``max_tokens`` and retry. None: keep the
    upstream's."""
    if _SYSTEM_PLACEMENT.search(message):
        return SYSTEM_ROLE_REFUSED
    for pattern in _OVERFLOWS:
        found = pattern.search(message)
        if found is None:
            continue
        tokens, limit = int(found["input"]), int(found["limit"])
        budget = found.groupdict().get("max")
        if budget is None or tokens >= limit:
            return f"prompt is too long: {tokens} tokens > {limit} maximum"
        return (f"input length and `max_tokens` exceed context limit: {tokens} + {budget} > "
                f"{limit}, decrease input length or `max_tokens` and try again")
    return None


def anthropic_error(status: int, body: Any) -> tuple[int, dict[str, Any]]:
    """``(status, error)`` on the Anthropic surface for an OpenAI-compatible upstream's error
    answer (its parsed body; None when it is not JSON): ``{"type": "error", "error":
    {"type", "message"}}``, the message kept, the type
    by status. 503 becomes 529 ``overloaded_error`` (what Anthropic clients expect when
    capacity runs out); other statuses are kept. A body with no message gets
    ``"upstream error (HTTP <status>)"``. A 400 that a client recovers from on Anthropic's
    words (a system message refused where it sits, in place: Claude Code folds such
    messages into its user turns; a context overflow: it compacts, or lowers
    ``max_tokens``) begins with those words (:func:`_in_anthropics_words`), the upstream's
    after them."""
    message = _error_message(body) or f"upstream error (HTTP {status})"
    if status == 503:
        status = 529
    elif status == 400 and (words := _in_anthropics_words(message)) is not None:
        message = f"{words} (the upstream said: {message})"
    return status, {"type": "error", "error": {"type": error_type_of(status),
                                               "message": message}}
