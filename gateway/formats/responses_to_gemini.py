"""A Responses client (``/v1/responses``) calling a Gemini upstream: the two translations the
gateway already has, composed through Chat Completions, as
:mod:`gateway.formats.responses_to_anthropic` does for Claude. Pure, no I/O.

    request   Responses -> chat (:func:`~gateway.formats.responses_to_openai.chat_request`)
              -> generateContent (:class:`~gateway.formats.openai_to_gemini.OpenAIToGemini`)
    answer    GenerateContentResponse -> chat completion -> response object
    error     Google's error -> OpenAI's
    stream    Gemini events -> chat chunks -> Responses' typed events
"""

from __future__ import annotations

from typing import Any

from gateway.formats.openai_to_gemini import OpenAIToGemini
from gateway.formats.responses_to_anthropic import ComposedStream
from gateway.formats.responses_to_openai import ResponsesStreamFromChat, chat_request
from gateway.formats.responses_to_openai.answer import response_from_chat

__all__ = ["ResponsesToGemini"]

_CHAT_TO_GEMINI = OpenAIToGemini()


class ResponsesToGemini:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    path = _CHAT_TO_GEMINI.path

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """The GenerateContentRequest for ``model``; raises InvalidRequest (400)."""
        chat = chat_request(body, model, default_max_tokens)
        return _CHAT_TO_GEMINI.request(chat, model, default_max_tokens)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object of a 200 GenerateContentResponse, echoing ``request``'s
        settings; raises UpstreamError (502)."""
        return response_from_chat(_CHAT_TO_GEMINI.response(body), request)

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """Google's error in OpenAI's shape."""
        return _CHAT_TO_GEMINI.error(status, body)

    def stream(self, request: dict[str, Any] | None = None) -> ComposedStream:
        """A new translator for one streamed answer to ``request``."""
        return ComposedStream(_CHAT_TO_GEMINI.stream(), ResponsesStreamFromChat(request))
