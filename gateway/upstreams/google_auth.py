"""OAuth 2.0 access tokens for Vertex AI, through google-auth (not our own crypto or JWTs).

:class:`GoogleTokens` holds one credentials object per upstream: a service-account key file
(``google.oauth2.service_account``, which signs a JWT and trades it at the file's
``token_uri``) or application default credentials (``google.auth.default()``: the
GOOGLE_APPLICATION_CREDENTIALS file, gcloud's user credentials, workload identity, the
metadata server). :meth:`GoogleTokens.token` returns a valid token, refreshing it before it
expires: google-auth counts a token invalid 3 min 45 s before its expiry
(``google.auth._helpers.REFRESH_THRESHOLD``), so a request never leaves with one that dies
on the way. Loading and refreshing do blocking I/O (files, HTTP through ``requests``): they
run on a worker thread (``asyncio.to_thread``), one refresh at a time however many requests
wait for it.

Sources: https://cloud.google.com/docs/authentication/application-default-credentials,
https://developers.google.com/identity/protocols/oauth2/service-account,
https://googleapis.dev/python/google-auth/latest/user-guide.html
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import google.auth
import google.auth.exceptions
import google.auth.transport.requests
from google.oauth2 import service_account

from gateway.errors import UpstreamError, UpstreamUnreachable

__all__ = ["SCOPES", "GoogleTokens", "credentials_file"]

#: What the tokens may do: Vertex AI takes cloud-platform.
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


class GoogleTokens:
    """Access tokens of one identity. ``file``: a service-account key file's path (None:
    application default credentials). Loaded by :meth:`load`; :meth:`token` refreshes."""

    def __init__(self, file: str | None) -> None:
        self.file = file
        #: The project the credentials name (None when they name none), after :meth:`load`.
        self.project: str | None = None
        self._credentials: Any = None
        self._lock = asyncio.Lock()
        self._request: google.auth.transport.requests.Request | None = None

    def load(self) -> None:
        """Find the credentials (blocking: files, maybe the metadata server). Raises
        google.auth.exceptions.DefaultCredentialsError (or OSError, ValueError for an
        unreadable key file)."""
        if self.file:
            credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                self.file, scopes=SCOPES)
            project = credentials.project_id
        else:
            credentials, project = google.auth.default(scopes=SCOPES)
        self._credentials, self.project = credentials, project or None

    @property
    def loaded(self) -> bool:
        return self._credentials is not None

    async def token(self) -> str:
        """A token valid for at least the next few minutes; refreshed on a worker thread
        when not. Raises UpstreamUnreachable when the token endpoint cannot be reached,
        UpstreamError (502) when it refuses the credentials."""
        credentials = self._credentials
        if credentials is None:
            raise UpstreamError("no Google credentials were found for this upstream")
        if credentials.valid and credentials.token:
            return str(credentials.token)
        async with self._lock:  # the requests that waited share the one refresh
            if not (credentials.valid and credentials.token):
                await asyncio.to_thread(self._refresh)
        return str(credentials.token)

    def forget(self) -> None:
        """Drop the token (Google refused it: revoked, or the clock is off): the next
        :meth:`token` gets a new one."""
        if self._credentials is not None:
            self._credentials.token = None

    def _refresh(self) -> None:
        if self._request is None:  # (one requests session, reused: its keep-alive pool)
            self._request = google.auth.transport.requests.Request()
        try:
            self._credentials.refresh(self._request)
        except google.auth.exceptions.TransportError as exc:
            raise UpstreamUnreachable("cannot reach Google's token endpoint") from exc
        except google.auth.exceptions.GoogleAuthError as exc:
            raise UpstreamError("Google refused this upstream's credentials") from exc


def credentials_file(file: str, file_env: str | None) -> str | None:
    """The service-account key file to use: ``file_env``'s value when set there, else
    ``file``; None (application default credentials) when neither names one (an upstream
    whose ``file_env`` is unset is disabled before it gets here: gateway.upstreams.google)."""
    named = os.environ.get(file_env) if file_env else None
    return named or file or None
