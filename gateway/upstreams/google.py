"""Upstream ``type = "gemini"`` (the Gemini API) and ``type = "vertex"`` (Vertex AI: Gemini,
or Claude), each behind the one upstream interface, on the transport of
:mod:`gateway.upstreams.openai` (one aiohttp keep-alive pool, errors converted at the
boundary). What differs is done here: the URL, which names the model; the body, which does
not; and the credentials.

- ``gemini``: ``POST {base_url}/v1beta/models/{model}:generateContent``, streamed
  ``:streamGenerateContent?alt=sse``; the key in ``x-goog-api-key`` (from ``api_key_env``).
  The upstream speaks Gemini's format (``api = "gemini"``): requests reach it translated by
  :mod:`gateway.formats.bridge` (``model`` in the body, taken out here).
  https://ai.google.dev/api/generate-content
- ``vertex`` with ``google.publisher = "google"``: the same body at
  ``/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent``
  (https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/inference).
- ``vertex`` with ``google.publisher = "anthropic"``: Claude, through ``:rawPredict`` and
  ``:streamRawPredict`` (the stream is Anthropic's SSE as it is): the upstream speaks
  Anthropic Messages (``api = "anthropic"``), so an Anthropic client's body goes as it came
  (``cache_control`` breakpoints intact) and an OpenAI or Responses client's through the
  existing Anthropic bridges; here ``model`` moves from the body into the URL and
  ``anthropic_version`` (``vertex-2023-10-16``) goes into the body, as the anthropic SDK's
  Vertex client does. Token counting: ``count-tokens:rawPredict``.
  https://cloud.google.com/vertex-ai/generative-ai/docs/partner-models/claude/use-claude

Vertex signs in with OAuth access tokens (``Authorization: Bearer``) from google-auth
(:mod:`gateway.upstreams.google_auth`), found when the gateway starts: without credentials
(or a project), the upstream is disabled and routing skips it, as with an unset key.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import google.auth.exceptions
import orjson
import structlog

from gateway.config import UpstreamConfig
from gateway.errors import InvalidRequest, UpstreamError
from gateway.formats.anthropic import error_type_of
from gateway.upstreams.base import (
    RawHeaders,
    ReadResponse,
    UpstreamRequest,
    UpstreamResponse,
    json_headers,
)
from gateway.upstreams.google_auth import GoogleTokens, credentials_file
from gateway.upstreams.openai import OpenAIUpstream

__all__ = ["GeminiUpstream", "VertexUpstream", "anthropic_error_of", "take_model"]

log = structlog.get_logger("gateway.upstreams.google")

#: The Anthropic paths the gateway sends a Claude upstream (gateway.upstreams.anthropic).
_MESSAGES, _COUNT = "/v1/messages", "/v1/messages/count_tokens"


def take_model(body: bytes) -> tuple[str, dict[str, Any]]:
    """A request body's ``model`` and the body without it (the URL names the model)."""
    obj = orjson.loads(body)
    model = obj.pop("model", None) if isinstance(obj, dict) else None
    if not isinstance(model, str) or not model:
        raise InvalidRequest("the request names no model", param="model")
    return model, obj


def anthropic_error_of(status: int, body: bytes) -> bytes:
    """An error body for an Anthropic client: Google's ``{"error": {"code", "message",
    "status"}}`` as Anthropic's ``{"type": "error", "error": {"type", "message"}}`` (the
    type by status: 429 ``rate_limit_error``, 401 ``authentication_error``...); any other
    body as it came."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    error = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(error, dict) or obj.get("type") == "error" or "status" not in error:
        return body
    return orjson.dumps({"type": "error", "error": {"type": error_type_of(status), "message":
                                                    str(error.get("message") or "")}})


def _segment(model: str) -> str:
    """``model`` as one URL path segment (a pattern's model id may carry the client's text:
    ``/``, ``?``, ``;`` are escaped, ``@`` of Vertex's versioned ids kept)."""
    return quote(model, safe="@")


def _gemini_method(stream: bool) -> str:
    return "streamGenerateContent?alt=sse" if stream else "generateContent"


class GeminiUpstream(OpenAIUpstream):
    """``type = "gemini"``: the Gemini API, keyed by ``x-goog-api-key``."""

    api = "gemini"
    provider = "gcp.gemini"
    key_header, key_prefix = "x-goog-api-key", ""

    def __init__(self, name: str, config: UpstreamConfig):
        super().__init__(name, config)
        self._models = f"/{config.google.api_version or 'v1beta'}/models/"

    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        model, body = take_model(request.body)
        path = f"{self._models}{_segment(model)}:{_gemini_method(request.stream)}"
        return await super().stream(replace(request, path=path, body=orjson.dumps(body)))


class VertexUpstream(OpenAIUpstream):
    """``type = "vertex"``: Vertex AI's Gemini (``publisher = "google"``) or Claude
    (``"anthropic"``) models, with OAuth tokens from google-auth."""

    provider = "gcp.vertex_ai"

    def __init__(self, name: str, config: UpstreamConfig):
        super().__init__(name, config)
        options = config.google
        self.api = "anthropic" if options.publisher == "anthropic" else "gemini"
        self._tokens = GoogleTokens(credentials_file(options.credentials_file,
                                                     options.credentials_file_env))
        named = options.credentials_file_env
        if named and not os.environ.get(named):
            self._enabled = False  # as with an unset api_key_env: routing skips it
        self._bearer = ""
        self._prefix = ""  # /v1/projects/{p}/locations/{l}/publishers/{pub}/models/, on start
        self._starting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Find the credentials and the project (off the event loop); without either, the
        upstream is disabled (logged, as an unset key is)."""
        options = self.config.google
        try:
            await asyncio.to_thread(self._tokens.load)
        except (google.auth.exceptions.GoogleAuthError, OSError, ValueError) as exc:
            log.warning("vertex_credentials_not_found", upstream=self.name,
                        error=type(exc).__name__)
            self._enabled = False
            return
        project = options.project or self._tokens.project
        if not project:
            log.warning("vertex_project_not_set", upstream=self.name)
            self._enabled = False
            return
        self._prefix = (f"/{options.api_version or 'v1'}/projects/{quote(project, safe='')}"
                        f"/locations/{options.location}/publishers/{options.publisher}/models/")

    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        if not self._prefix:  # (not started: a test's upstream, or start-up still running)
            if self._starting is None:
                self._starting = asyncio.ensure_future(self.start())
            await asyncio.shield(self._starting)
            if not self._prefix:
                raise UpstreamError(f"upstream {self.name!r} has no Google credentials or "
                                    "project")
        self._bearer = "Bearer " + await self._tokens.token()
        response = await super().stream(self._routed(request))
        if response.status == 401:  # the token was refused (revoked?): the next gets another
            self._tokens.forget()
        if response.status < 400 or self.api != "anthropic":
            return response
        # Vertex's own refusals (auth, quota) come in Google's shape; Claude's clients read
        # Anthropic's: the body is put in it (a model's own errors already are)
        try:
            body = await response.read()
        finally:
            response.close()
        error = anthropic_error_of(response.status, body)
        return ReadResponse(response.status, json_headers(response.headers, error), error)

    def _routed(self, request: UpstreamRequest) -> UpstreamRequest:
        """``request`` for Vertex: the model in the URL, the body as Vertex takes it."""
        if self.api == "gemini":
            model, body = take_model(request.body)
            path = self._prefix + f"{_segment(model)}:{_gemini_method(request.stream)}"
        elif request.path == _COUNT:
            body = orjson.loads(request.body)
            body.setdefault("anthropic_version", self.config.google.anthropic_version)
            path = self._prefix + "count-tokens:rawPredict"
        elif request.path == _MESSAGES:
            model, body = take_model(request.body)
            body.setdefault("anthropic_version", self.config.google.anthropic_version)
            method = "streamRawPredict" if request.stream or body.get("stream") else "rawPredict"
            path = self._prefix + f"{_segment(model)}:{method}"
        else:
            raise InvalidRequest(f"{request.path} is not available on Claude through Vertex AI",
                                 code="unsupported_endpoint")
        return replace(request, path=path, body=orjson.dumps(body))

    def _merge(self, client: RawHeaders, request_id: str) -> dict[str, str]:
        out = super()._merge(client, request_id)
        out.pop("anthropic-version", None)  # (Vertex takes it in the body)
        out["authorization"] = self._bearer  # the identity's current token, for every request
        return out
