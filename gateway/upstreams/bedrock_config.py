"""``[upstreams.NAME.bedrock]``: the options of a ``type = "bedrock"`` upstream (Amazon
Bedrock's runtime API, :mod:`gateway.upstreams.bedrock`).

No secret is ever configured here: the upstream signs with the credentials botocore's
default chain finds (environment, shared config/credentials file and its ``profile``, web
identity, container and instance roles). ``base_url`` on the upstream, when set, replaces the
regional endpoint (a VPC endpoint, a fake in tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["BedrockOptions"]


@dataclass(frozen=True)
class BedrockOptions:
    """How one Bedrock upstream is spoken to."""

    #: ``invoke``: InvokeModel / InvokeModelWithResponseStream with Anthropic's Messages body
    #: (Claude models; the upstream's API is "anthropic", nothing translated for an
    #: Anthropic client). ``converse``: Converse / ConverseStream, Bedrock's own format that
    #: every model on Bedrock speaks (API "converse", translated from every client API).
    api: Literal["invoke", "converse"] = "invoke"
    #: AWS region (``us-east-1``...); empty: ``AWS_REGION``, ``AWS_DEFAULT_REGION`` or the
    #: profile's ``region``, as botocore finds it. Cross-region inference profile ids
    #: (``us.anthropic.claude-...``) are model ids: they go in a target's ``model``.
    region: str = ""
    #: A named profile of the shared AWS config files; empty: ``AWS_PROFILE`` or the
    #: default chain.
    profile: str = ""
    #: The ``anthropic_version`` an InvokeModel body carries (Bedrock's only value today;
    #: the client's ``anthropic-version`` header is the first-party API's, not Bedrock's).
    anthropic_version: str = "bedrock-2023-05-31"
