"""An Anthropic client calling a model through Amazon Bedrock's Converse API: the Messages
request goes up as a Converse request, and what comes back, whole or streamed, returns as
Anthropic's. Pure, no I/O.

    request   converse_request(body, model) -> the Converse request (:mod:`.request`:
              what maps, what is dropped, what is a 400)
    answer    message_from_converse(answer) -> the Messages ``message``
              (:mod:`gateway.formats.converse`)
    error     already Anthropic's: the upstream reads Bedrock's errors where they enter
              (gateway.upstreams.bedrock_errors)
    stream    AnthropicStreamFromConverse: ConverseStream events -> Messages events
              (:mod:`gateway.formats.converse_stream`)

The OpenAI and Responses directions (:mod:`gateway.formats.openai_to_converse`,
:mod:`gateway.formats.responses_to_converse`) go through this one and their Anthropic
translations.
Sources: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html,
https://docs.anthropic.com/en/api/messages
"""

from __future__ import annotations

from typing import Any

from gateway.formats.anthropic_to_converse.request import converse_request
from gateway.formats.converse import message_from_converse
from gateway.formats.converse_stream import AnthropicStreamFromConverse

__all__ = ["AnthropicToConverse", "converse_request"]


class AnthropicToConverse:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    #: (The upstream makes its own path from the model: gateway.upstreams.bedrock.)
    path = "/converse"

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """:func:`converse_request` for ``model``; raises InvalidRequest (400)."""
        return converse_request(body, model)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``message`` of a 200 Converse body (parsed); raises UpstreamError (502)."""
        return message_from_converse(body, _model(request))

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """The upstream's error, already in Anthropic's shape."""
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return status, body
        return status, {"type": "error", "error": {"type": "api_error",
                                                   "message": "Bedrock error"}}

    def stream(self, request: dict[str, Any] | None = None) -> AnthropicStreamFromConverse:
        """A new translator for one streamed answer."""
        return AnthropicStreamFromConverse(_model(request))


def _model(request: dict[str, Any] | None) -> str:
    model = request.get("model") if request else None
    return model if isinstance(model, str) else ""
