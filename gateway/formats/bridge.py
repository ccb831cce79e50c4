"""A request on its way to an upstream that speaks the other API, and its answer back: a
table of the two directions, each a :class:`Bridge` from a client API to an upstream API.

    ("openai", "anthropic")   :class:`~gateway.formats.openai_to_anthropic.OpenAIToAnthropic`
    ("anthropic", "openai")   :class:`~gateway.formats.anthropic_to_openai.AnthropicToOpenAI`
    ("responses", "openai")   :class:`~gateway.formats.responses_to_openai.ResponsesToOpenAI`
    ("responses", "anthropic") :class:`~gateway.formats.responses_to_anthropic.ResponsesToAnthropic`
    ("openai", "converse")    :class:`~gateway.formats.openai_to_converse.OpenAIToConverse`
    ("anthropic", "converse") :class:`~gateway.formats.anthropic_to_converse.AnthropicToConverse`
    ("responses", "converse") :class:`~gateway.formats.responses_to_converse.ResponsesToConverse`
    ("openai", "gemini")      :class:`~gateway.formats.openai_to_gemini.OpenAIToGemini`
    ("anthropic", "gemini")   :class:`~gateway.formats.anthropic_to_gemini.AnthropicToGemini`
    ("responses", "gemini")   :class:`~gateway.formats.responses_to_gemini.ResponsesToGemini`

A direction gives the upstream path, the request body translated for the target model, and
the answer translated back, whole (``response``, ``error``: from the upstream's body as
dispatch parsed it, to the client's as a dict for dispatch to serialise) or event by event
(``stream``, driven by :class:`TranslatedStream`). Only the chat endpoints cross (``/v1/completions`` and
``/v1/embeddings`` have no Anthropic counterpart: 400). One translator per (client API,
upstream API) pair, each with its own tests, as Envoy AI Gateway lays out its translators.
Sources: https://platform.openai.com/docs/api-reference/chat,
https://docs.anthropic.com/en/api/messages
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from gateway.errors import InvalidRequest
from gateway.formats.anthropic_to_converse import AnthropicToConverse
from gateway.formats.anthropic_to_gemini import AnthropicToGemini
from gateway.formats.anthropic_to_openai import AnthropicToOpenAI
from gateway.formats.openai_to_anthropic import OpenAIToAnthropic
from gateway.formats.openai_to_converse import OpenAIToConverse
from gateway.formats.openai_to_gemini import OpenAIToGemini
from gateway.formats.responses_to_anthropic import ResponsesToAnthropic
from gateway.formats.responses_to_converse import ResponsesToConverse
from gateway.formats.responses_to_gemini import ResponsesToGemini
from gateway.formats.responses_to_openai import ResponsesToOpenAI
from gateway.formats.translator import Translator

__all__ = ["Bridge", "TranslatedStream", "bridge"]


class Bridge(Protocol):
    """One direction, from a client API to an upstream API."""

    @property
    def path(self) -> str:
        """The upstream's chat endpoint, relative to its base URL."""
        ...

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """The client's (already checked) body for ``model`` upstream; raises
        InvalidRequest (400) naming what the upstream's API cannot express."""
        ...

    def response(self, body: Any, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """A complete 200 response (its body parsed; None when it is not JSON), in the
        client's format (``request``: the client's, whose settings a Responses answer
        echoes); raises UpstreamError (502) for a body that is not one."""
        ...

    def error(self, status: int, body: Any) -> tuple[int, dict[str, Any]]:
        """An error response (status, its body parsed or None) as (status, error) in the
        client's format."""
        ...

    def stream(self, request: dict[str, Any] | None = None) -> Translator:
        """A new translator for one streamed answer (to ``request``, as ``response``)."""
        ...


_DIRECTIONS: dict[tuple[str, str], Bridge] = {
    ("openai", "anthropic"): OpenAIToAnthropic(),
    ("anthropic", "openai"): AnthropicToOpenAI(),
    ("responses", "openai"): ResponsesToOpenAI(),
    ("responses", "anthropic"): ResponsesToAnthropic(),
    ("openai", "converse"): OpenAIToConverse(),
    ("anthropic", "converse"): AnthropicToConverse(),
    ("responses", "converse"): ResponsesToConverse(),
    ("openai", "gemini"): OpenAIToGemini(),
    ("anthropic", "gemini"): AnthropicToGemini(),
    ("responses", "gemini"): ResponsesToGemini(),
}


def bridge(client: str, upstream: str, kind: str) -> Bridge | None:
    """The bridge between two APIs, None when they are the same; raises InvalidRequest for
    an endpoint that has no counterpart upstream."""
    if client == upstream:
        return None
    if (client, upstream) not in _DIRECTIONS:
        raise InvalidRequest(f"/v1/responses is not yet available for this model: it is "
                             f"served by {_an(upstream)} upstream",
                             code="unsupported_endpoint")
    if kind != "chat":
        raise InvalidRequest(f"/v1/{kind} is not available for this model: it is served by "
                             f"{_an(upstream)} upstream, which has no such endpoint",
                             code="unsupported_endpoint")
    return _DIRECTIONS[(client, upstream)]


def _an(api: str) -> str:
    return "a Gemini" if api == "gemini" else f"an {api.capitalize()}"


class TranslatedStream:
    """An upstream's open stream (``first``, ``chunks``, ``finish()``, ``close()``: the
    :class:`gateway.context.Stream` protocol) seen through a translator."""

    __slots__ = ("_inner", "_translator", "chunks", "first")

    def __init__(self, inner: Any, translator: Translator) -> None:
        self._inner = inner
        self._translator = translator
        # Opening events made early (Translator.head), already sent: the stream still holds
        # them, for what keeps or shares it (the cache, coalesced followers).
        self.first = translator.early + translator.feed(inner.first)
        self.chunks: AsyncIterator[bytes] = self._translate(inner.chunks)

    async def _translate(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        translator = self._translator
        async for chunk in chunks:
            out = translator.feed(chunk)
            if out:
                yield out
        rest = translator.flush()
        if rest:
            yield rest

    async def finish(self) -> None:
        await self._inner.finish()

    def close(self, failed: bool = False) -> None:
        self._inner.close(failed)
