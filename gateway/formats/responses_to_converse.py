"""A Responses client (``/v1/responses``) calling a model through Bedrock's Converse API:
Responses -> Messages (:class:`~gateway.formats.responses_to_anthropic.ResponsesToAnthropic`,
itself through chat) -> Converse, and the answer back the same way. Pure, no I/O.
"""

from __future__ import annotations

from typing import Any

from gateway.formats.anthropic_to_converse import AnthropicToConverse
from gateway.formats.responses_to_anthropic import ComposedStream, ResponsesToAnthropic

__all__ = ["ResponsesToConverse"]

_MESSAGES = ResponsesToAnthropic()
_CONVERSE = AnthropicToConverse()


class ResponsesToConverse:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    path = _CONVERSE.path

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """The Converse request for ``model``; raises InvalidRequest (400)."""
        return _CONVERSE.request(_MESSAGES.request(body, model, default_max_tokens), model,
                                 default_max_tokens)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object of a 200 Converse body, echoing ``request``'s settings."""
        return _MESSAGES.response(_CONVERSE.response(body, request), request)

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        return _MESSAGES.error(status, body)

    def stream(self, request: dict[str, Any] | None = None) -> ComposedStream:
        """A new translator for one streamed answer to ``request``."""
        return ComposedStream(_CONVERSE.stream(request), _MESSAGES.stream(request))
