"""A Responses client (``/v1/responses``) calling an Anthropic upstream: the two translations
the gateway already has, composed through Chat Completions. Pure, no I/O.

    request   Responses -> chat (:func:`~gateway.formats.responses_to_openai.chat_request`)
              -> Messages (:class:`~gateway.formats.openai_to_anthropic.OpenAIToAnthropic`)
    answer    Messages -> chat completion -> response object
    error     Anthropic's error -> OpenAI's (529 becomes 503)
    stream    Messages events -> chat chunks -> Responses' typed events (two translators in
              a row, :class:`ComposedStream`)

Each step is the tested translator of its own direction; what one cannot express is a 400
from that step.
"""

from __future__ import annotations

from typing import Any

from gateway.formats.openai_to_anthropic import OpenAIToAnthropic
from gateway.formats.responses_to_openai import ResponsesStreamFromChat, chat_request
from gateway.formats.responses_to_openai.answer import response_from_chat
from gateway.formats.translator import EventTranslator

__all__ = ["ComposedStream", "ResponsesToAnthropic"]

_CHAT_TO_ANTHROPIC = OpenAIToAnthropic()


class ComposedStream:
    """``first``'s output fed to ``second``: done when ``second`` is; errored when either is
    (an error event of the first is translated by the second)."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: EventTranslator, second: EventTranslator | ComposedStream
                 ) -> None:
        self._first, self._second = first, second

    @property
    def done(self) -> bool:
        return self._second.done

    @property
    def errored(self) -> bool:
        return self._first.errored or self._second.errored

    #: Opening events are never made early through two translations.
    early = b""

    def head(self, model: str) -> bytes:
        return b""

    def feed(self, chunk: bytes) -> bytes:
        middle = self._first.feed(chunk)
        return self._second.feed(middle) if middle else b""

    def flush(self) -> bytes:
        middle = self._first.flush()
        return (self._second.feed(middle) if middle else b"") + self._second.flush()


class ResponsesToAnthropic:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    path = _CHAT_TO_ANTHROPIC.path

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """The Messages request for ``model``; raises InvalidRequest (400)."""
        chat = chat_request(body, model, default_max_tokens)
        return _CHAT_TO_ANTHROPIC.request(chat, model, default_max_tokens)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object of a 200 Messages body (parsed), echoing ``request``'s
        settings; raises UpstreamError (502)."""
        return response_from_chat(_CHAT_TO_ANTHROPIC.response(body), request)

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """Anthropic's error in OpenAI's shape (529 as 503)."""
        return _CHAT_TO_ANTHROPIC.error(status, body)

    def stream(self, request: dict[str, Any] | None = None) -> ComposedStream:
        """A new translator for one streamed answer to ``request``."""
        return ComposedStream(_CHAT_TO_ANTHROPIC.stream(), ResponsesStreamFromChat(request))
