"""A Responses client (``/v1/responses``) calling an upstream that speaks only Chat
Completions (the local engine, vLLM, SGLang): the request goes up as a chat request, and
the answer returns as a ``response`` object. Pure, no I/O.

    request   chat_request(body, model, default_max_tokens) -> the chat request (:mod:`.request`)
    answer    response_from_chat(chat_completion, request) -> the response (:mod:`.answer`)

Streaming (chat chunks as Responses' typed events) and the bridge entry are to follow
(issue 30).
"""

from __future__ import annotations

from gateway.formats.responses_to_openai.answer import response_from_chat
from gateway.formats.responses_to_openai.request import chat_request

__all__ = ["chat_request", "response_from_chat"]
