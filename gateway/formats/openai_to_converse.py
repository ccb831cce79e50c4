"""An OpenAI client (Chat Completions) calling a model through Bedrock's Converse API: the
two translations the gateway has, composed through Anthropic's Messages. Pure, no I/O.

    request   chat -> Messages (:class:`~gateway.formats.openai_to_anthropic.OpenAIToAnthropic`)
              -> Converse (:class:`~gateway.formats.anthropic_to_converse.AnthropicToConverse`)
    answer    Converse -> Messages -> chat completion
    error     Anthropic's shape (the upstream's) -> OpenAI's
    stream    ConverseStream events -> Messages events -> chat chunks (:class:`ComposedStream`)

Each step is the tested translator of its own direction; what one cannot express is a 400
from that step (``n > 1``, ``logprobs``... from the first, server tools from the second).
"""

from __future__ import annotations

from typing import Any

from gateway.formats.anthropic_to_converse import AnthropicToConverse
from gateway.formats.openai_to_anthropic import OpenAIToAnthropic
from gateway.formats.responses_to_anthropic import ComposedStream

__all__ = ["OpenAIToConverse"]

_CHAT = OpenAIToAnthropic()
_CONVERSE = AnthropicToConverse()


class OpenAIToConverse:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    path = _CONVERSE.path

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """The Converse request for ``model``; raises InvalidRequest (400)."""
        return _CONVERSE.request(_CHAT.request(body, model, default_max_tokens), model,
                                 default_max_tokens)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """The chat completion of a 200 Converse body; raises UpstreamError (502)."""
        return _CHAT.response(_CONVERSE.response(body, request))

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """The upstream's (Anthropic-shaped) error in OpenAI's shape."""
        return _CHAT.error(status, body)

    def stream(self, request: dict[str, Any] | None = None) -> ComposedStream:
        """A new translator for one streamed answer."""
        return ComposedStream(_CONVERSE.stream(request), _CHAT.stream())
