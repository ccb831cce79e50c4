"""The Gemini wire format (``generateContent``, ``streamGenerateContent``): what every
translation to or from a Gemini upstream reads the same way. Pure, no I/O.

- :func:`finish_reason_of`: a candidate's ``finishReason`` as OpenAI's ``finish_reason``
  (``STOP`` stop, ``MAX_TOKENS`` length, the safety family content_filter);
- :func:`usage_to_openai`, :func:`usage_of`: ``usageMetadata`` as OpenAI's usage and as the
  gateway's :class:`~gateway.formats.usage.Usage`: ``promptTokenCount`` counts the whole
  prompt, ``cachedContentTokenCount`` the part read from the (implicit or explicit) cache,
  ``candidatesTokenCount`` plus ``thoughtsTokenCount`` the output;
- :func:`candidate_parts`: the first candidate's text (thoughts left out) and function calls;
- :func:`refusal_of`: why an answer was blocked (``promptFeedback.blockReason``, a safety
  finish with its blocked ratings), as a sentence;
- :func:`openai_error`: Google's error (``{"error": {"code", "message", "status"}}``) as
  (status, OpenAI's error body).

Sources: https://ai.google.dev/api/generate-content (GenerateContentResponse, FinishReason,
UsageMetadata, SafetyRating), https://cloud.google.com/apis/design/errors,
https://ai.google.dev/gemini-api/docs/troubleshooting (the API's errors by status)
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.formats.ids import random_hex
from gateway.formats.usage import Usage

__all__ = ["GEMINI_PATH", "SAFETY_FINISHES", "candidate_parts", "finish_reason_of",
           "openai_error", "refusal_of", "tool_call", "usage_of", "usage_to_openai"]

#: The chat path a bridge to Gemini gives: the upstream puts the model and the method in
#: the URL (gateway.upstreams.google), this only says "generate".
GEMINI_PATH = "/generateContent"
#: finishReason values that mean the answer was stopped by a content filter.
SAFETY_FINISHES = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT",
                             "SPII", "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT",
                             "IMAGE_RECITATION"})
_LENGTH = frozenset({"MAX_TOKENS"})


def finish_reason_of(reason: Any, called: bool = False) -> str:
    """OpenAI's ``finish_reason`` for a Gemini ``finishReason`` (``called``: the answer holds
    a function call: ``tool_calls``, which a tool loop waits for, whatever Gemini says)."""
    if called:
        return "tool_calls"
    if reason in _LENGTH:
        return "length"
    if reason in SAFETY_FINISHES:
        return "content_filter"
    return "stop"  # STOP, and the rest (OTHER, LANGUAGE, MALFORMED_FUNCTION_CALL...)


def usage_to_openai(metadata: Any) -> dict[str, Any]:
    """``usageMetadata`` as OpenAI usage: ``prompt_tokens`` the whole prompt (cache reads
    included), ``prompt_tokens_details.cached_tokens`` the reads, ``completion_tokens`` the
    answer and its thoughts (``completion_tokens_details.reasoning_tokens``)."""
    meta = metadata if isinstance(metadata, dict) else {}
    prompt = _int(meta.get("promptTokenCount")) + _int(meta.get("toolUsePromptTokenCount"))
    thoughts = _int(meta.get("thoughtsTokenCount"))
    completion = _int(meta.get("candidatesTokenCount")) + thoughts
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": _int(meta.get("cachedContentTokenCount"))},
            "completion_tokens_details": {"reasoning_tokens": thoughts}}


def usage_of(metadata: Any) -> Usage | None:
    """The gateway's token counts of ``usageMetadata`` (None for none)."""
    if not isinstance(metadata, dict) or not metadata:
        return None
    usage = usage_to_openai(metadata)
    return Usage(usage["prompt_tokens"], usage["completion_tokens"],
                 usage["prompt_tokens_details"]["cached_tokens"])


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def candidate_parts(answer: dict[str, Any]) -> tuple[dict[str, Any] | None, str,
                                                      list[dict[str, Any]]]:
    """The first candidate (None when there is none), its text (``thought`` parts left out)
    and its function calls as OpenAI tool calls (``id``: Gemini's when it gives one, else
    a new ``call_...``; ``arguments``: the ``args`` object as JSON)."""
    candidates = answer.get("candidates")
    candidate = candidates[0] if isinstance(candidates, list) and candidates \
        and isinstance(candidates[0], dict) else None
    content = candidate.get("content") if candidate is not None else None
    parts = content.get("parts") if isinstance(content, dict) else None
    texts, calls = [], []
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict) or part.get("thought"):
            continue
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        call = part.get("functionCall")
        if isinstance(call, dict):
            calls.append(tool_call(call))
    return candidate, "".join(texts), calls


def tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A ``functionCall`` part's object as an OpenAI tool call."""
    args = call.get("args")
    call_id = call.get("id")
    return {"id": call_id if isinstance(call_id, str) and call_id else "call_" + random_hex(),
            "type": "function", "function": {
                "name": str(call.get("name") or ""),
                "arguments": orjson.dumps(args if isinstance(args, dict) else {}).decode()}}


def refusal_of(answer: dict[str, Any], candidate: dict[str, Any] | None) -> str | None:
    """Why Gemini withheld the answer, or None: the prompt blocked
    (``promptFeedback.blockReason``) or the answer stopped by a filter (a safety finish,
    naming the categories rated ``blocked``)."""
    feedback = answer.get("promptFeedback")
    if candidate is None and isinstance(feedback, dict) and feedback.get("blockReason"):
        return f"Gemini blocked the prompt ({feedback['blockReason']})"
    reason = candidate.get("finishReason") if candidate is not None else None
    if reason not in SAFETY_FINISHES:
        return None
    ratings = candidate.get("safetyRatings") if candidate is not None else None
    blocked = [str(r.get("category")) for r in ratings or () if isinstance(r, dict)
               and r.get("blocked")]
    return f"Gemini stopped the answer ({reason}" + (f": {', '.join(blocked)})" if blocked
                                                    else ")")


#: Google's status name -> (OpenAI type, code, the status the client gets).
_ERRORS = {
    "INVALID_ARGUMENT": ("invalid_request_error", "invalid_request", 400),
    "FAILED_PRECONDITION": ("invalid_request_error", "failed_precondition", 400),
    "OUT_OF_RANGE": ("invalid_request_error", "invalid_request", 400),
    "UNAUTHENTICATED": ("authentication_error", "invalid_api_key", 401),
    "PERMISSION_DENIED": ("permission_error", "forbidden", 403),
    "NOT_FOUND": ("invalid_request_error", "not_found", 404),
    "RESOURCE_EXHAUSTED": ("rate_limit_error", "rate_limit_exceeded", 429),
    "CANCELLED": ("upstream_error", "cancelled", 499),
    "INTERNAL": ("server_error", "internal_error", 500),
    "UNAVAILABLE": ("overloaded_error", "overloaded", 503),
    "DEADLINE_EXCEEDED": ("upstream_error", "upstream_timeout", 504),
}
_BY_CODE = {code: name for name, (_, _, code) in _ERRORS.items()
            if name not in ("FAILED_PRECONDITION", "OUT_OF_RANGE")}


def openai_error(status: int, body: Any) -> tuple[int, dict[str, Any]]:
    """``(status, {"error": {message, type, param: null, code}})`` for a Google error answer
    (its parsed body; None when not JSON): the message kept, the type from Google's
    ``status`` name (else from the HTTP status). An invalid API key, which the Gemini API
    answers 400 INVALID_ARGUMENT with the reason ``API_KEY_INVALID``, becomes 401
    ``authentication_error``: it is the upstream's key that is wrong, not the request."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    name = error.get("status") if error.get("status") in _ERRORS else _BY_CODE.get(status)
    message = error.get("message") if isinstance(error.get("message"), str) \
        and error["message"] else f"upstream error (HTTP {status})"
    reasons = [d.get("reason") for d in error.get("details") or () if isinstance(d, dict)]
    if "API_KEY_INVALID" in reasons:
        name, status = "UNAUTHENTICATED", 401
    type_, code, _ = _ERRORS.get(name or "", ("upstream_error", "upstream_error", status))
    return status, {"error": {"message": message, "type": type_, "param": None, "code": code}}
