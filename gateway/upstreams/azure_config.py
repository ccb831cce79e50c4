"""``[upstreams.NAME.azure]``: the options of a ``type = "azure_openai"`` upstream
(:mod:`gateway.upstreams.azure`), and the checks that tie them to the rest of its table.

Two URL forms (https://learn.microsoft.com/azure/ai-foundry/openai/api-version-lifecycle):

- ``url_form = "v1"`` (the default; Azure's "v1 API", GA since August 2025):
  ``{base_url}/openai/v1/chat/completions``, the deployment named by ``model`` in the body,
  no ``api-version``; it also serves ``/openai/v1/responses`` (``native_responses``);
- ``url_form = "deployments"``: ``{base_url}/openai/deployments/{model}/chat/completions
  ?api-version={api_version}``, the dated API every Azure OpenAI resource has served.

Auth: the ``api-key`` header (the table's ``api_key_env``), or a Microsoft Entra ID bearer
token from ``token_env`` (read at start) or ``token_file`` (read again whenever the file
changes: a sidecar or cron job keeps it fresh). Exactly one of the three; never a secret in
the file (https://learn.microsoft.com/azure/ai-foundry/openai/reference#authentication).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["DEFAULT_API_VERSION", "AzureOptions", "check_azure"]

#: The latest GA data-plane inference version of the dated API (Azure OpenAI REST API
#: reference, "Latest GA release": https://learn.microsoft.com/azure/ai-foundry/openai/reference).
DEFAULT_API_VERSION = "2024-10-21"
_VERSION = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(-preview)?$|^(preview|latest)$")


@dataclass(frozen=True)
class AzureOptions:
    """``azure = { ... }`` of an ``azure_openai`` upstream (module docstring)."""

    #: "v1" (``/openai/v1/...``, model in the body) or "deployments"
    #: (``/openai/deployments/{model}/...?api-version=``). v1 by default: Azure's current
    #: API, which also serves Responses; "deployments" for resources or tools pinned to a
    #: dated version.
    url_form: Literal["v1", "deployments"] = "v1"
    #: ``api-version`` of the deployments form (a date, ``-preview`` allowed); the latest GA.
    api_version: str = DEFAULT_API_VERSION
    #: Environment variable holding a Microsoft Entra ID access token (audience
    #: ``https://cognitiveservices.azure.com``), sent as ``Authorization: Bearer``; read once.
    token_env: str | None = None
    #: A file holding such a token, read again whenever it changes (its mtime, size or inode):
    #: whatever refreshes the token rewrites it (the gateway never sees a client secret).
    token_file: str | None = None

    def __post_init__(self) -> None:
        if not _VERSION.match(self.api_version):
            raise ValueError(f"azure.api_version {self.api_version!r} is not an Azure API "
                             "version such as '2024-10-21' or '2025-04-01-preview'")
        if self.token_env is not None and self.token_file is not None:
            raise ValueError("azure: set token_env or token_file, not both")
        if self.token_env == "" or self.token_file == "":
            raise ValueError("azure: token_env and token_file may not be empty")


def check_azure(type_: str, base_url: str, api_key_env: str | None, native_responses: bool,
                options: AzureOptions) -> None:
    """Raises ValueError naming what an upstream table gets wrong about Azure: options on
    another type, no or two ways to authenticate, a ``base_url`` that is not a resource
    endpoint (``https://RESOURCE.openai.azure.com``, no ``/openai``), ``native_responses``
    on the deployments form (Responses are served under ``/openai/v1`` only)."""
    if type_ != "azure_openai":
        if options != AzureOptions():
            raise ValueError("azure applies to type 'azure_openai' only")
        return
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("type 'azure_openai' needs base_url, the resource endpoint "
                         "(https://RESOURCE.openai.azure.com)")
    if "/openai" in parts.path or parts.query:
        raise ValueError("base_url is the resource endpoint, without /openai or a query: "
                         "the gateway adds the path of azure.url_form")
    ways = [api_key_env is not None, options.token_env is not None,
            options.token_file is not None]
    if sum(ways) != 1:
        raise ValueError("type 'azure_openai' authenticates one way: api_key_env (the api-key "
                         "header), azure.token_env or azure.token_file (an Entra ID token)")
    if native_responses and options.url_form != "v1":
        raise ValueError("native_responses needs azure.url_form = 'v1' (Azure serves "
                         "Responses under /openai/v1)")
