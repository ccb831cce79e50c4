"""The ``[upstreams.<name>.google]`` table of a ``type = "gemini"`` or ``type = "vertex"``
upstream (:mod:`gateway.upstreams.google`): where the model lives and how the gateway signs in.

    [upstreams.vertex-claude]
    type = "vertex"
    google = { project = "my-project", location = "us-east5", publisher = "anthropic" }

No secret is ever in the file: the Gemini API key comes from ``api_key_env``; Vertex's OAuth
tokens from a service-account key file named by ``credentials_file_env`` (or
``credentials_file``), else from application default credentials
(https://cloud.google.com/docs/authentication/application-default-credentials).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["GEMINI_API_URL", "GoogleOptions", "vertex_url"]

#: The Gemini API (https://ai.google.dev/api): ``type = "gemini"``'s default ``base_url``.
GEMINI_API_URL = "https://generativelanguage.googleapis.com"


def vertex_url(location: str) -> str:
    """Vertex AI's endpoint for ``location``: ``https://{location}-aiplatform.googleapis.com``,
    ``https://aiplatform.googleapis.com`` for ``global``, the multi-region endpoints for
    ``us`` and ``eu`` (https://cloud.google.com/vertex-ai/docs/reference/rest#service-endpoint;
    the anthropic SDK's Vertex client picks the same)."""
    if location == "global":
        return "https://aiplatform.googleapis.com"
    if location in ("us", "eu"):
        return f"https://aiplatform.{location}.rep.googleapis.com"
    return f"https://{location}-aiplatform.googleapis.com"


@dataclass(frozen=True)
class GoogleOptions:
    """Gemini API and Vertex AI settings (all optional but ``project`` on Vertex without
    application default credentials that name one)."""

    #: Vertex: the Google Cloud project id. "": the one the credentials name (the
    #: service-account file's ``project_id``, or ADC's project, e.g. GOOGLE_CLOUD_PROJECT).
    project: str = ""
    #: Vertex: the region the model is served from (``us-east5``, ``europe-west1``...), or
    #: ``global``. Default us-central1, where Vertex serves the most Gemini models.
    location: str = "us-central1"
    #: Vertex: whose models the upstream serves. ``google``: Gemini, through
    #: ``generateContent``/``streamGenerateContent`` (the upstream speaks Gemini's format);
    #: ``anthropic``: Claude, through ``rawPredict``/``streamRawPredict`` (it speaks
    #: Anthropic Messages).
    publisher: Literal["google", "anthropic"] = "google"
    #: Vertex: an environment variable holding the path of a service-account key file
    #: (named here but unset in the environment: the upstream is disabled, as with
    #: ``api_key_env``). Not named (and no ``credentials_file``): application default
    #: credentials.
    credentials_file_env: str | None = None
    #: Vertex: the path of a service-account key file (a path, not the key: the file stays
    #: outside the config). ``credentials_file_env`` wins when both are set.
    credentials_file: str = ""
    #: Claude on Vertex: the ``anthropic_version`` put in the body (Vertex takes the version
    #: there, not in a header).
    anthropic_version: str = "vertex-2023-10-16"
    #: The URL's API version. "": ``v1beta`` on the Gemini API (where every feature is),
    #: ``v1`` on Vertex.
    api_version: str = ""

    def __post_init__(self) -> None:
        for name in ("project", "location", "api_version"):
            value = getattr(self, name)
            if "/" in value or "?" in value or "#" in value:
                raise ValueError(f"google.{name} must not contain '/', '?' or '#'")
        if not self.location:
            raise ValueError("google.location must be set (a region, or 'global')")
