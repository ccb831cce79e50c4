"""Google's side of OAuth for the fakes (:mod:`gateway.testing.fake_vertex`): a service
account with a test RSA key, the token endpoint that trades its signed JWT for an access
token, and the check of ``Authorization: Bearer`` that accepts only tokens it issued and
that have not expired. With it, google-auth runs for real in the tests (its
``service_account.Credentials`` signs the JWT and posts it to ``token_uri``, which points
here), so a wrong key, a wrong audience or a token that was never issued is refused as Google
refuses it.

- :func:`service_account`: a key file's JSON (``type``, ``project_id``, ``private_key`` PEM,
  ``client_email``, ``token_uri``...) and the public key that checks its signatures.
- :class:`TokenIssuer`: ``grant(form)`` for ``POST /token`` (RFC 7523 JWT bearer grant:
  ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>``, RS256 checked
  with the public key, ``iss``, ``aud`` = Google's token endpoint, ``scope``, ``exp``) -> ``{access_token,
  expires_in, token_type}``; ``check(authorization)`` raises :class:`GoogleError` 401
  UNAUTHENTICATED for anything else.
- :class:`GoogleError` and :func:`google_error`: Google's error body, ``{"error": {"code",
  "message", "status"}}`` (https://cloud.google.com/apis/design/errors#http_mapping).

Sources: https://developers.google.com/identity/protocols/oauth2/service-account#httprest,
https://datatracker.ietf.org/doc/html/rfc7523
"""

from __future__ import annotations

import base64
import secrets
import time
from typing import Any
from urllib.parse import parse_qs

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

__all__ = ["CLOUD_PLATFORM", "GoogleError", "TokenIssuer", "google_error", "service_account"]

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
_JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: The audience a service account's JWT names, wherever it is posted (google-auth writes it
#: so, and Google's token endpoint wants it).
AUDIENCE = "https://oauth2.googleapis.com/token"
#: HTTP status -> Google's canonical status name (google.rpc.Code).
STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
            404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
            503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def google_error(code: int, message: str, details: list[Any] | None = None) -> dict[str, Any]:
    """Google's error body for HTTP ``code``."""
    error: dict[str, Any] = {"code": code, "message": message,
                             "status": STATUSES.get(code, "UNKNOWN")}
    if details:
        error["details"] = details
    return {"error": error}


class GoogleError(Exception):
    """An answer in Google's error shape: HTTP ``code``, its body by :func:`google_error`."""

    def __init__(self, code: int, message: str, details: list[Any] | None = None,
                 retry_after: str | None = None) -> None:
        super().__init__(message)
        self.code, self.body = code, google_error(code, message, details)
        self.retry_after = retry_after


def service_account(token_uri: str, project: str = "fake-project",
                    email: str = "gateway@fake-project.iam.gserviceaccount.com"
                    ) -> tuple[dict[str, Any], rsa.RSAPublicKey]:
    """A service account's key file (as JSON-ready dict) with a new 2048-bit RSA key, whose
    tokens come from ``token_uri``; and the public key that checks its JWTs."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    info = {"type": "service_account", "project_id": project,
            "private_key_id": secrets.token_hex(20), "private_key": pem,
            "client_email": email, "client_id": "1" * 21,
            "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": token_uri}
    return info, key.public_key()


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class TokenIssuer:
    """The token endpoint of one service account (``email``, checked with ``public_key``;
    ``token_uri``: where it is served): tokens live ``lifetime_s`` seconds.
    :meth:`of` makes the account and its issuer together."""

    @classmethod
    def of(cls, token_uri: str) -> TokenIssuer:
        """A new service account's issuer, its key file in ``account``."""
        info, public = service_account(token_uri)
        return cls(info["client_email"], public, token_uri, account=info)

    def __init__(self, email: str, public_key: rsa.RSAPublicKey, token_uri: str,
                 lifetime_s: float = 3600.0, account: dict[str, Any] | None = None) -> None:
        self.email, self.public_key, self.token_uri = email, public_key, token_uri
        #: The key file's JSON, when the issuer keeps it for a test to write out.
        self.account = account
        self.lifetime_s = lifetime_s
        self.granted = 0  # tokens issued (a test counts the refreshes)
        self._tokens: dict[str, float] = {}  # token -> when it expires (time.time())

    def grant(self, form: bytes) -> dict[str, Any]:
        """The answer to ``POST /token``; raises GoogleError 400 (``invalid_grant``) for an
        assertion that is not this account's, signed by its key, for this endpoint."""
        fields = {k: v[0] for k, v in parse_qs(form.decode("latin-1")).items()}
        if fields.get("grant_type") != _JWT_BEARER:
            raise GoogleError(400, "invalid_grant: unsupported grant_type")
        try:
            head, payload, signature = fields["assertion"].split(".")
            header, claims = orjson.loads(_b64(head)), orjson.loads(_b64(payload))
            self.public_key.verify(_b64(signature), f"{head}.{payload}".encode(),
                                   padding.PKCS1v15(), hashes.SHA256())
        except (KeyError, ValueError, InvalidSignature, orjson.JSONDecodeError) as exc:
            raise GoogleError(400, "invalid_grant: Invalid JWT Signature.") from exc
        now = time.time()
        if header.get("alg") != "RS256" or claims.get("iss") != self.email \
                or claims.get("aud") != AUDIENCE \
                or CLOUD_PLATFORM not in str(claims.get("scope", "")).split() \
                or not claims.get("iat", 0) - 300 <= now < claims.get("exp", 0):
            raise GoogleError(400, "invalid_grant: Invalid JWT: claims not accepted.")
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        self._tokens[token] = now + self.lifetime_s
        self.granted += 1
        return {"access_token": token, "expires_in": int(self.lifetime_s),
                "token_type": "Bearer"}

    def revoke(self) -> None:
        """Every token issued so far stops being accepted."""
        self._tokens.clear()

    def check(self, authorization: str | None) -> None:
        """Raises GoogleError 401 UNAUTHENTICATED unless ``authorization`` is ``Bearer`` and
        a token issued here that has not expired."""
        token = (authorization or "").removeprefix("Bearer ").strip()
        expires = self._tokens.get(token)
        if expires is None or expires <= time.time():
            raise GoogleError(401, "Request had invalid authentication credentials. Expected "
                                   "OAuth 2 access token, login cookie or other valid "
                                   "authentication credential.")
