"""An OpenAI client calling a Gemini upstream (the Gemini API, or Gemini on Vertex AI): the
Chat Completions request goes up as a ``generateContent`` request, and what comes back,
whole or streamed, returns as OpenAI's. Pure, no I/O.

    request   gemini_request(body, model) -> the GenerateContentRequest (:mod:`.request`:
              what maps to what, what is dropped, what is a 400; schemas: :mod:`.schema`)
    answer    openai_response(answer) -> the chat.completion (:mod:`.answer`)
    error     gateway.formats.gemini.openai_error(status, error) -> (status, OpenAI's error)
    stream    OpenAIStreamFromGemini: Gemini's SSE events -> chat.completion.chunk events
              (:mod:`.stream`)

:class:`OpenAIToGemini` puts the four behind the interface :mod:`gateway.formats.bridge`
holds each direction to.
Sources: https://ai.google.dev/api/generate-content,
https://platform.openai.com/docs/api-reference/chat
"""

from __future__ import annotations

from typing import Any

from gateway.formats.gemini import GEMINI_PATH, openai_error
from gateway.formats.openai_to_gemini.answer import openai_response
from gateway.formats.openai_to_gemini.request import gemini_request
from gateway.formats.openai_to_gemini.stream import OpenAIStreamFromGemini

__all__ = ["OpenAIStreamFromGemini", "OpenAIToGemini", "gemini_request", "openai_response"]


class OpenAIToGemini:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    #: A placeholder: a Gemini upstream puts the model and the method (generateContent, or
    #: streamGenerateContent?alt=sse) in the URL itself (gateway.upstreams.google).
    path = GEMINI_PATH

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """:func:`gemini_request` (``default_max_tokens`` unused: Gemini needs no limit).
        Raises InvalidRequest (400)."""
        return gemini_request(body, model)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """:func:`openai_response` of a 200 GenerateContentResponse; raises UpstreamError."""
        return openai_response(body)

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """Google's error as OpenAI's (:func:`gateway.formats.gemini.openai_error`)."""
        return openai_error(status, body)

    def stream(self, request: dict[str, Any] | None = None) -> OpenAIStreamFromGemini:
        """A new translator for one streamed answer."""
        return OpenAIStreamFromGemini()
