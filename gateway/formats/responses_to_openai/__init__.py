"""A Responses client (``/v1/responses``) calling an upstream that speaks only Chat
Completions (the local engine, vLLM, SGLang): the request goes up as a chat request, and
the answer returns as a ``response`` object. Pure, no I/O.

    request   chat_request(body, model, default_max_tokens) -> the chat request (:mod:`.request`)
    answer    response_from_chat(chat_completion, request) -> the response (:mod:`.answer`)
    stream    ResponsesStreamFromChat(request): chat chunks -> Responses' typed events
              (:mod:`.stream`)

The bridge entry and the endpoint that serves it are to follow (issue 30).
"""

from __future__ import annotations

from gateway.formats.responses_to_openai.answer import response_from_chat
from gateway.formats.responses_to_openai.request import chat_request
from gateway.formats.responses_to_openai.stream import ResponsesStreamFromChat

__all__ = ["ResponsesStreamFromChat", "chat_request", "response_from_chat"]
