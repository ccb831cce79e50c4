"""An Anthropic client calling an OpenAI-compatible upstream (a hosted API, vLLM, SGLang, the
local engine): the Messages request goes up as a Chat Completions request, and what comes
back, whole or streamed, returns as Anthropic's. Pure, no I/O.

    request   openai_request(body, model) -> the Chat Completions request
              (:mod:`.request`: what maps to what, what is dropped, what is a 400)
    answer    anthropic_response(completion, model=None) -> the Messages response (dict)
    error     anthropic_error(status, error) -> (status, the Anthropic error object)
              (both :mod:`.answer`, with usage_from_openai)
    stream    AnthropicStreamFromOpenAI: chat.completion.chunk events -> Messages events
              (:mod:`.stream`)

:class:`AnthropicToOpenAI` puts the four behind the interface
:mod:`gateway.formats.bridge` holds each direction to.
Sources: https://docs.anthropic.com/en/api/messages, https://docs.anthropic.com/en/api/errors,
https://docs.anthropic.com/en/docs/build-with-claude/streaming,
https://platform.openai.com/docs/api-reference/chat
"""

from __future__ import annotations

from typing import Any

from gateway.formats.anthropic_to_openai.answer import (
    anthropic_error,
    anthropic_response,
    usage_from_openai,
)
from gateway.formats.anthropic_to_openai.request import openai_request
from gateway.formats.anthropic_to_openai.stream import AnthropicStreamFromOpenAI

__all__ = ["AnthropicStreamFromOpenAI", "AnthropicToOpenAI", "anthropic_error",
           "anthropic_response", "openai_request", "usage_from_openai"]


class AnthropicToOpenAI:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    #: The Chat Completions endpoint, relative to its upstreams' base URL (which ends in /v1).
    path = "/chat/completions"

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """:func:`openai_request`: the Chat Completions request for ``model``
        (``default_max_tokens`` is unused: a Messages request always sets ``max_tokens``).
        Raises InvalidRequest (400)."""
        return openai_request(body, model)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """:func:`anthropic_response` of a 200 ``chat.completion`` (parsed); raises
        UpstreamError (502)."""
        return anthropic_response(body)

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """:func:`anthropic_error`: ``(status, error)``, 503 becoming 529."""
        return anthropic_error(status, body)

    def stream(self, request: dict[str, Any] | None = None) -> AnthropicStreamFromOpenAI:
        """A new translator for one streamed answer (the upstream's model name)."""
        return AnthropicStreamFromOpenAI()
