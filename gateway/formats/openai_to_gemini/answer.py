"""An OpenAI client calling a Gemini upstream: the upstream's complete answer (a
GenerateContentResponse) becomes a ``chat.completion``. Pure, no I/O. (Its errors:
:func:`gateway.formats.gemini.openai_error`.)

    openai_response(answer) -> the chat.completion (a dict)

Finish reasons, usage and refusals are read by :mod:`gateway.formats.gemini`.
Sources: https://ai.google.dev/api/generate-content#generatecontentresponse,
https://platform.openai.com/docs/api-reference/chat/object
"""

from __future__ import annotations

import time
from typing import Any

from gateway.errors import UpstreamError
from gateway.formats.gemini import candidate_parts, finish_reason_of, refusal_of, usage_to_openai
from gateway.formats.ids import random_hex

__all__ = ["openai_response"]


def openai_response(answer: Any) -> dict[str, Any]:
    """The ``chat.completion`` for a GenerateContentResponse (its parsed body):
    ``{id: "chatcmpl-" + responseId (or a new one), object, created (now), model:
    modelVersion, choices: [{index 0, message: {role "assistant", content: the first
    candidate's text (thoughts left out; None when none), refusal: why Gemini blocked it
    (else None), tool_calls (from functionCall parts) when any}, logprobs None,
    finish_reason}], usage}``. A blocked prompt (no candidate) is ``content_filter``.
    Raises UpstreamError (502) for a body that is not a GenerateContentResponse."""
    if not isinstance(answer, dict) or not ("candidates" in answer
                                            or "promptFeedback" in answer):
        raise UpstreamError("the upstream's answer is not a GenerateContentResponse")
    candidate, text, calls = candidate_parts(answer)
    refusal = refusal_of(answer, candidate)
    message: dict[str, Any] = {"role": "assistant", "content": text or None,
                               "refusal": refusal if not text else None}
    if calls:
        message["tool_calls"] = calls
    reason = candidate.get("finishReason") if candidate is not None else "SAFETY"
    id_ = answer.get("responseId")
    return {
        "id": "chatcmpl-" + (id_ if isinstance(id_, str) and id_ else random_hex()),
        "object": "chat.completion", "created": int(time.time()),
        "model": str(answer.get("modelVersion") or ""),
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason_of(reason, bool(calls))}],
        "usage": usage_to_openai(answer.get("usageMetadata")),
    }
