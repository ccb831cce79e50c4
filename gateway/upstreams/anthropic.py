"""Upstream ``type = "anthropic"``: the Anthropic Messages API (https://api.anthropic.com).

The same transport as :mod:`gateway.upstreams.openai` (one aiohttp keep-alive pool per
upstream, errors converted at the boundary); what differs is authentication and versioning:
the key goes in ``x-api-key``, ``anthropic-version`` is the client's when it sent one (it
knows the shape it speaks), else the configured one, and ``anthropic-beta`` carries the
configured features plus the client's. Requests reach it in the Messages format: either an
Anthropic client's body, forwarded as it is (``cache_control`` and ``thinking`` blocks
intact), or an OpenAI client's, translated by :mod:`gateway.formats.openai_to_anthropic`.
Reference: https://docs.anthropic.com/en/api/versioning, https://docs.anthropic.com/en/api/beta-headers
"""

from __future__ import annotations

from gateway.config import UpstreamConfig
from gateway.upstreams.base import RawHeaders
from gateway.upstreams.openai import OpenAIUpstream

__all__ = ["MESSAGES_PATH", "AnthropicUpstream"]

#: The Messages endpoint, relative to ``base_url`` (which has no ``/v1``).
MESSAGES_PATH = "/v1/messages"


class AnthropicUpstream(OpenAIUpstream):
    api = "anthropic"
    provider = "anthropic"
    key_header, key_prefix = "x-api-key", ""

    def __init__(self, name: str, config: UpstreamConfig):
        super().__init__(name, config)
        self._version = config.anthropic_version
        self._beta = ",".join(config.beta)

    def _merge(self, client: RawHeaders, request_id: str) -> dict[str, str]:
        out = super()._merge(client, request_id)
        out.setdefault("anthropic-version", self._version)
        # Every beta the client named (one header, or several: HTTP joins repeated lines
        # with commas, RFC 9110 5.3), after the configured ones, each once.
        betas = [self._beta, *(v.decode("latin-1") for k, v in client
                               if k == b"anthropic-beta")]
        features = dict.fromkeys(f for f in (p.strip() for b in betas for p in b.split(","))
                                 if f)
        out.pop("anthropic-beta", None)
        if features:
            out["anthropic-beta"] = ",".join(features)
        return out
