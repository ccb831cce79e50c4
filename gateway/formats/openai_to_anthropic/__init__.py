"""An OpenAI client calling an Anthropic upstream (Claude): the Chat Completions request goes
up as a Messages request, and what comes back, whole or streamed, returns as OpenAI's.
Pure, no I/O.

    request   anthropic_request(body, model, default_max_tokens) -> the Messages request
              (:mod:`.request`: what maps to what, what is dropped, what is a 400)
    answer    openai_response(answer, model=None) -> the chat.completion (dict)
    error     openai_error(status, error) -> the OpenAI error object (dict)  (both :mod:`.answer`)
    stream    OpenAIStreamFromAnthropic: Messages events -> chat.completion.chunk events
              (:mod:`.stream`)

:class:`OpenAIToAnthropic` puts the four behind the interface
:mod:`gateway.formats.bridge` holds each direction to.
Sources: https://docs.anthropic.com/en/api/messages, https://docs.anthropic.com/en/api/errors,
https://docs.anthropic.com/en/docs/build-with-claude/streaming,
https://platform.openai.com/docs/api-reference/chat
"""

from __future__ import annotations

from typing import Any

from gateway.formats.openai_to_anthropic.answer import openai_error, openai_response
from gateway.formats.openai_to_anthropic.request import anthropic_request
from gateway.formats.openai_to_anthropic.stream import OpenAIStreamFromAnthropic

__all__ = ["OpenAIStreamFromAnthropic", "OpenAIToAnthropic", "anthropic_request",
           "openai_error", "openai_response"]


class OpenAIToAnthropic:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    #: Anthropic's chat endpoint, relative to its upstreams' base URL (which, as the
    #: anthropic SDK takes it, does not end in /v1).
    path = "/v1/messages"

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """:func:`anthropic_request`: the Messages request for ``model``; ``max_tokens`` is
        ``default_max_tokens`` when the body sets none. Raises InvalidRequest (400)."""
        return anthropic_request(body, model, default_max_tokens)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """:func:`openai_response` of a 200 Messages body (parsed); raises UpstreamError
        (502)."""
        return openai_response(body)

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """``(status, error)``: the error by :func:`openai_error`; Anthropic's 529 (overloaded)
        becomes 503, a status the openai SDK knows and retries; other statuses are kept."""
        return (503 if status == 529 else status), openai_error(status, body)

    def stream(self, request: dict[str, Any] | None = None) -> OpenAIStreamFromAnthropic:
        """A new translator for one streamed answer (the upstream's model name, ``created``
        now)."""
        return OpenAIStreamFromAnthropic()
