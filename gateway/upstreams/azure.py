"""Upstream ``type = "azure_openai"``: Azure OpenAI (https://RESOURCE.openai.azure.com).

It is OpenAI chat on the wire, so it is an :class:`~gateway.upstreams.openai.OpenAIUpstream`
(``api = "openai"``: dispatch, the bridges for Anthropic and Responses clients, retries,
stream watching apply unchanged) that differs in three places, all here:

- **URL** (:mod:`gateway.upstreams.azure_config`): the v1 form sends a request where
  OpenAI's would go, under ``{base_url}/openai/v1`` (``model`` in the body names the
  deployment; Responses served natively there); the deployments form puts the deployment,
  read from the body's ``model``, in the path and adds ``?api-version=``.
- **Auth**: ``api-key: KEY`` (``api_key_env``), or ``Authorization: Bearer TOKEN``, a
  Microsoft Entra ID token from ``azure.token_env`` or ``azure.token_file`` (stat'ed on
  every request, about a microsecond, and read again when it changed).
- **Errors**: Azure's error bodies are OpenAI's shape without a string ``type``
  (``{"error": {"code": "429", "message": ...}}``; a content-filter 400 has ``"type": null``,
  ``"code": "content_filter"`` and ``innererror``): :func:`openai_error_body` gives them the
  ``type`` their status means, everything else kept, so an OpenAI client reads an OpenAI
  error and Azure's fields alike. ``retry-after-ms`` and ``retry-after`` on a 429 reach
  dispatch as sent (gateway.http.retry_after_ms honours both).

Content-filter fields (``prompt_filter_results``, ``content_filter_results``, the
``content_filter`` finish reason) are extra fields of OpenAI's shapes: they pass through to
OpenAI clients as they came, and the translations to Anthropic and Responses ignore what
they do not know (``content_filter`` becomes Anthropic's ``refusal`` stop reason).
Sources: https://learn.microsoft.com/azure/ai-foundry/openai/reference,
https://learn.microsoft.com/azure/ai-foundry/openai/concepts/content-filter,
https://learn.microsoft.com/azure/ai-foundry/openai/how-to/quota
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any
from urllib.parse import quote

import orjson

from gateway.config import UpstreamConfig
from gateway.errors import InvalidRequest, UpstreamUnreachable
from gateway.upstreams.base import RawHeaders, ReadResponse, UpstreamRequest, UpstreamResponse
from gateway.upstreams.openai import OpenAIUpstream

__all__ = ["AzureOpenAIUpstream", "TokenFile", "openai_error_body"]

#: OpenAI's ``error.type`` for a status, where Azure's body has none
#: (https://platform.openai.com/docs/guides/error-codes).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 408: "timeout", 409: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_exceeded"}


def openai_error_body(status: int, body: bytes) -> bytes:
    """``body`` (an error answer's, ``status`` >= 400) with ``error.type`` set from the
    status where Azure left it out or null (400s ``invalid_request_error``, 401
    ``authentication_error``, 403 ``permission_error``, 429 ``rate_limit_exceeded``, 5xx
    ``server_error``); ``body`` itself when it is already OpenAI's, or is no JSON object
    with an ``error`` object."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    error = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(error, dict) or isinstance(error.get("type"), str):
        return body
    error["type"] = _TYPES.get(status) or ("server_error" if status >= 500
                                           else "invalid_request_error")
    error.setdefault("param", None)
    return orjson.dumps(obj)


class TokenFile:
    """A bearer token kept in a file (``azure.token_file``): :meth:`token` reads it again
    whenever the file's mtime, size or inode changed (an atomic rename gives a new inode).
    Raises UpstreamUnreachable (the upstream cannot be asked: the next target is tried)
    while the file is missing or empty."""

    __slots__ = ("_name", "_path", "_stamp", "_token")

    def __init__(self, path: str, name: str) -> None:
        self._path, self._name = path, name
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def token(self) -> str:
        try:
            st = os.stat(self._path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                with open(self._path, encoding="utf-8") as f:
                    self._token = f.read().strip()
                self._stamp = stamp
        except (OSError, UnicodeDecodeError) as exc:
            raise UpstreamUnreachable(f"upstream {self._name!r}: its token file cannot "
                                      "be read") from exc
        if not self._token:
            raise UpstreamUnreachable(f"upstream {self._name!r}: its token file is empty")
        return self._token


class AzureOpenAIUpstream(OpenAIUpstream):
    """Azure OpenAI behind the upstream interface (module docstring). ``enabled``: its key
    or token variable is set (a token file is looked for on each request)."""

    api = "openai"
    provider = "azure.ai.openai"
    key_header, key_prefix = "api-key", ""

    def __init__(self, name: str, config: UpstreamConfig):
        super().__init__(name, config)
        options = config.azure
        root = config.base_url.rstrip("/") + "/openai"
        self._deployments = options.url_form == "deployments"
        self.base_url = root + ("/deployments" if self._deployments else "/v1")
        self._query = "?api-version=" + quote(options.api_version, safe="")
        self._file: TokenFile | None = None
        if options.token_env is not None:
            token = os.environ.get(options.token_env)
            self._enabled = bool(token)
            if token:
                self._headers["authorization"] = f"Bearer {token}"
        elif options.token_file is not None:
            self._file = TokenFile(options.token_file, name)
            self._enabled = True

    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        if self._deployments:
            request = dataclasses.replace(request, path=self._deployment_path(request))
        response = await super().stream(request)
        if response.status < 400:
            return response
        try:  # an error is small: read whole, given OpenAI's type
            body = await response.read()
        finally:
            response.close()
        return ReadResponse(response.status, response.headers,
                             openai_error_body(response.status, body))

    def _deployment_path(self, request: UpstreamRequest) -> str:
        """``/{deployment}{path}?api-version=...``: the deployment is the body's ``model``
        (the target's ``model``, as dispatch wrote it). Raises InvalidRequest (400) for a
        body that names none."""
        try:
            body: Any = orjson.loads(request.body) if request.body else None
        except orjson.JSONDecodeError:
            body = None
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            raise InvalidRequest(f"{request.path} on Azure's deployments form needs a model "
                                 "(the deployment's name)", code="invalid_value")
        return f"/{quote(model, safe='')}{request.path}{self._query}"

    def _merge(self, client: RawHeaders, request_id: str) -> dict[str, str]:
        out = super()._merge(client, request_id)
        if self._file is not None:  # read again when it changed (TokenFile)
            out["authorization"] = f"Bearer {self._file.token()}"
        return out
