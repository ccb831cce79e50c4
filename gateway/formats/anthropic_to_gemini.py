"""An Anthropic client (``/v1/messages``) calling a Gemini upstream: the two translations the
gateway already has, composed through Chat Completions. Pure, no I/O.

    request   Messages -> chat (:func:`~gateway.formats.anthropic_to_openai.openai_request`)
              -> generateContent (:func:`~gateway.formats.openai_to_gemini.gemini_request`)
    answer    GenerateContentResponse -> chat completion -> Messages response
    error     Google's error -> OpenAI's -> Anthropic's (503 becoming 529)
    stream    Gemini events -> chat chunks -> Messages events (two translators in a row)

Each step is the tested translator of its own direction: what one cannot express is a 400
from that step. On the way, ``cache_control`` markers are dropped (Gemini caches a repeated
prefix by itself: its reads come back as ``cache_read_input_tokens``), and so are thinking
blocks (Gemini's thought signatures are not Anthropic's).
"""

from __future__ import annotations

from typing import Any

from gateway.formats.anthropic_to_openai import AnthropicToOpenAI
from gateway.formats.openai_to_gemini import OpenAIToGemini
from gateway.formats.responses_to_anthropic import ComposedStream

__all__ = ["AnthropicToGemini"]

_TO_CHAT = AnthropicToOpenAI()
_CHAT_TO_GEMINI = OpenAIToGemini()


class AnthropicToGemini:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    path = _CHAT_TO_GEMINI.path

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """The GenerateContentRequest for ``model``; raises InvalidRequest (400)."""
        chat = _TO_CHAT.request(body, model, default_max_tokens)
        return _CHAT_TO_GEMINI.request(chat, model, default_max_tokens)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Messages response of a 200 GenerateContentResponse; raises UpstreamError."""
        return _TO_CHAT.response(_CHAT_TO_GEMINI.response(body))

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """Google's error in Anthropic's shape (status by Google's, 503 as 529)."""
        status, error = _CHAT_TO_GEMINI.error(status, body)
        return _TO_CHAT.error(status, error)

    def stream(self, request: dict[str, Any] | None = None) -> ComposedStream:
        """A new translator for one streamed answer."""
        return ComposedStream(_CHAT_TO_GEMINI.stream(), _TO_CHAT.stream())
