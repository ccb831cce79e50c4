"""A Responses client (``/v1/responses``) calling an upstream that speaks only Chat
Completions (the local engine, vLLM, SGLang): the request goes up as a chat request, and
the answer returns as a ``response`` object. Pure, no I/O.

    request   chat_request(body, model, default_max_tokens) -> the chat request (:mod:`.request`)
    answer    response_from_chat(chat_completion, request) -> the response (:mod:`.answer`)
    stream    ResponsesStreamFromChat(request): chat chunks -> Responses' typed events
              (:mod:`.stream`)

:class:`ResponsesToOpenAI` puts them behind the interface :mod:`gateway.formats.bridge`
holds each direction to.
"""

from __future__ import annotations

from typing import Any

from gateway.formats.responses_to_openai.answer import response_from_chat
from gateway.formats.responses_to_openai.request import chat_request
from gateway.formats.responses_to_openai.stream import ResponsesStreamFromChat

__all__ = ["ResponsesStreamFromChat", "ResponsesToOpenAI", "chat_request",
           "response_from_chat"]


class ResponsesToOpenAI:
    """This direction as the bridge drives it (:class:`gateway.formats.bridge.Bridge`)."""

    __slots__ = ()

    #: The chat endpoint, relative to an OpenAI-style upstream's base URL (.../v1).
    path = "/chat/completions"

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """:func:`chat_request`; raises InvalidRequest (400)."""
        return chat_request(body, model, default_max_tokens)

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """:func:`response_from_chat` of a 200 chat completion (parsed), echoing
        ``request``'s settings; raises UpstreamError (502)."""
        return response_from_chat(body, request)

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """The upstream's OpenAI error as it is (both sides speak OpenAI's error shape); a
        body that is not one becomes an ``upstream_error``."""
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return status, body
        return status, {"error": {"message": f"upstream answered {status}",
                                  "type": "upstream_error", "param": None, "code": None}}

    def stream(self, request: dict[str, Any] | None = None) -> ResponsesStreamFromChat:
        """A new translator for one streamed answer to ``request``."""
        return ResponsesStreamFromChat(request)
