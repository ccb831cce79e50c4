"""A request on its way to an upstream that speaks the other API, and its answer back.

A :class:`Bridge` joins a client API to an upstream API (``openai`` -> ``anthropic`` or
``anthropic`` -> ``openai``): the upstream path, the request body translated for the target
model, and the answer translated back, whole (:meth:`Bridge.response`, :meth:`Bridge.error`)
or event by event (:class:`TranslatedStream`). The translations themselves are
:mod:`gateway.formats.anthropic_openai` and :mod:`gateway.formats.anthropic_openai_stream`;
only the chat endpoints cross (``/v1/completions`` and ``/v1/embeddings`` have no Anthropic
counterpart: 400).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from gateway.errors import InvalidRequest
from gateway.formats import anthropic_openai as translate
from gateway.formats.anthropic_openai_stream import (
    AnthropicStreamFromOpenAI,
    OpenAIStreamFromAnthropic,
)

__all__ = ["Bridge", "TranslatedStream", "bridge"]

#: Each API's chat endpoint, relative to its upstreams' base URL (OpenAI's base URL ends in
#: /v1; Anthropic's, as its SDK takes it, does not).
CHAT_PATHS = {"openai": "/chat/completions", "anthropic": "/v1/messages"}


class Translator(Protocol):
    done: bool

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class Bridge:
    """From ``client`` API to ``upstream`` API (``path``: the upstream's chat endpoint)."""

    __slots__ = ("client", "path", "upstream")

    def __init__(self, client: str, upstream: str) -> None:
        self.client = client
        self.upstream = upstream
        self.path = CHAT_PATHS[upstream]

    def request(self, body: dict[str, Any], model: str, default_max_tokens: int
                ) -> dict[str, Any]:
        """The client's (already checked) body for ``model`` upstream; raises
        InvalidRequest (400) naming what the upstream's API cannot express."""
        if self.upstream == "anthropic":
            return translate.anthropic_request(body, model, default_max_tokens)
        return translate.openai_request(body, model)

    def response(self, body: bytes) -> bytes:
        """A complete 200 response, in the client's format."""
        if self.client == "openai":
            return translate.openai_response(body)
        return translate.anthropic_response(body)

    def error(self, status: int, body: bytes) -> tuple[int, bytes]:
        """An error response (status, body) in the client's format."""
        if self.client == "openai":
            return (503 if status == 529 else status), translate.openai_error(status, body)
        return translate.anthropic_error(status, body)

    def stream(self) -> Translator:
        if self.client == "openai":
            return OpenAIStreamFromAnthropic()
        return AnthropicStreamFromOpenAI()


_BRIDGES = {("openai", "anthropic"): Bridge("openai", "anthropic"),
            ("anthropic", "openai"): Bridge("anthropic", "openai")}


def bridge(client: str, upstream: str, kind: str) -> Bridge | None:
    """The bridge between two APIs, None when they are the same; raises InvalidRequest for
    an endpoint that has no counterpart upstream."""
    if client == upstream:
        return None
    if kind != "chat":
        raise InvalidRequest(f"/v1/{kind} is not available for this model: it is served by "
                             f"an {upstream.capitalize()} upstream, which has no such endpoint",
                             code="unsupported_endpoint")
    return _BRIDGES[(client, upstream)]


class TranslatedStream:
    """An upstream's open stream (``first``, ``chunks``, ``finish()``, ``close()``: the
    :class:`gateway.context.Stream` protocol) seen through a translator."""

    __slots__ = ("_inner", "_translator", "chunks", "first")

    def __init__(self, inner: Any, translator: Translator) -> None:
        self._inner = inner
        self._translator = translator
        self.first = translator.feed(inner.first)
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
