"""AWS Signature Version 4 for Bedrock, through botocore (never our own crypto), and the
credentials it signs with, from botocore's default chain: environment variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), the shared
config and credentials files (a ``profile``), web identity (``AWS_WEB_IDENTITY_TOKEN_FILE``,
EKS), container and instance roles. Temporary credentials are refreshed by botocore before
they expire, off the event loop. The region: the option, else ``AWS_REGION``, else
botocore's (``AWS_DEFAULT_REGION``, the profile's ``region``).

Only ``host``, ``content-type``, ``accept`` and the ``x-amz-*`` headers are signed: headers
added after signing (``x-request-id``, ``traceparent``, forwarded test headers) travel
unsigned, as SigV4 allows. The signing name of ``bedrock-runtime`` is ``bedrock``.
Sources: https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv.html,
https://docs.aws.amazon.com/sdkref/latest/guide/standardized-credentials.html
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials, RefreshableCredentials
from botocore.exceptions import BotoCoreError

from gateway.upstreams.bedrock_config import BedrockOptions

__all__ = ["SIGNING_NAME", "Signer"]

#: The service name Bedrock runtime's requests are signed for.
SIGNING_NAME = "bedrock"


class Signer:
    """Signs requests for one upstream. :meth:`resolve` finds the credentials once (it may
    reach an instance's metadata service: call it off the loop); :meth:`credentials` then
    gives the current ones per request; :meth:`sign` the headers to add."""

    def __init__(self, options: BedrockOptions) -> None:
        self._session = botocore.session.Session(profile=options.profile or None)
        region = options.region or os.environ.get("AWS_REGION") or ""
        if not region:
            try:
                region = self._session.get_config_variable("region") or ""
            except BotoCoreError:  # a profile named that does not exist
                region = ""
        self.region: str = region
        self._credentials: Any = None
        self._resolved = False

    def resolve(self) -> bool:
        """Look the credentials up (botocore's chain, once); False when there are none."""
        if not self._resolved:
            try:
                self._credentials = self._session.get_credentials()
            except BotoCoreError:
                self._credentials = None
            self._resolved = True
        return self._credentials is not None

    @property
    def resolved(self) -> bool:
        return self._resolved

    async def credentials(self) -> ReadOnlyCredentials | None:
        """The credentials to sign with now (None: the chain found none); temporary ones
        near their expiry are refreshed in a thread (botocore may call STS or IMDS)."""
        if not self._resolved:
            await asyncio.to_thread(self.resolve)
        found = self._credentials
        if found is None:
            return None
        if isinstance(found, RefreshableCredentials) and found.refresh_needed():
            return await asyncio.to_thread(found.get_frozen_credentials)
        return found.get_frozen_credentials()

    def sign(self, credentials: ReadOnlyCredentials, url: str, body: bytes,
             headers: dict[str, str]) -> dict[str, str]:
        """``headers`` (lower-case names, all signed) with ``authorization``,
        ``x-amz-date`` and, for temporary credentials, ``x-amz-security-token`` added, for
        a POST of ``body`` to ``url`` (its path already percent-encoded as sent)."""
        request = AWSRequest(method="POST", url=url, data=body, headers=headers)
        SigV4Auth(credentials, SIGNING_NAME, self.region).add_auth(request)
        return {k.lower(): v for k, v in request.headers.items()}
